/* PTX wrappers for the Hopper (sm_90a) MLA kernel, mla_decode_wgmma.cu: shared-memory
 * matrix descriptors for the 128-byte swizzled tiles it keeps, wgmma in the shapes it
 * issues, the wgmma fences, mbarriers fed by cp.async, named barriers between its two
 * warpgroups. Internal to mla/; device code only, to be called from sm_90a code alone
 * (wgmma does not exist on other targets).
 *
 * Tiles. Every operand tile is a row-major matrix of 16-bit values split into column
 * blocks of 64 (128 bytes), each block a run of rows of 128 bytes; within every group of 8
 * rows (1024 bytes) the 16-byte chunk c of row r sits at chunk position c ^ (r % 8). This
 * is the 128-byte swizzle of wgmma; it requires each block to start 1024-byte aligned. Read
 * as "K-major" (the contiguous dimension is the reduction) a tile gives S = Q K^T's
 * operands; read "MN-major" (contiguous along N, transposed) the KV tile gives V for
 * O += P V without a second copy. */
#ifndef INA_MLA_MLA_WGMMA_CUH
#define INA_MLA_MLA_WGMMA_CUH

#include <stdint.h>

namespace ina_mla {
namespace wg {

constexpr int kSwizzleRowBytes = 128;  /* one swizzled row: 64 16-bit values */
constexpr int kSwizzleGroupBytes = 1024; /* 8 rows: the period of the swizzle */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* Byte offset of 16-byte chunk `chunk` (of 8 values) of row `row` in a swizzled tile with
 * `rows` rows per 64-column block. */
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk, int rows) {
  return static_cast<uint32_t>((chunk >> 3) * rows * kSwizzleRowBytes + row * kSwizzleRowBytes +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

/* Descriptor fields: start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29,
 * stride byte offset >> 4 in 32-45, layout 1 (128-byte swizzle) in 62-63. */
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32) | (1ull << 62);
}

/* K-major operand at `addr` (a k16 step within a 128-byte row is +32 bytes): rows 8 apart
 * are 1024 bytes apart; the leading offset is unused when K of one instruction lies in one
 * swizzled row. */
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return make_desc(addr, 16, kSwizzleGroupBytes);
}

/* MN-major operand at `addr`: 64-column blocks `block_bytes` apart (leading offset), groups
 * of 8 K rows 1024 bytes apart (stride offset). */
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t block_bytes) {
  return make_desc(addr, block_bytes, kSwizzleGroupBytes);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/* Keeps the compiler from moving register reads or writes of an accumulator across the
 * asynchronous wgmma issue / wait points. */
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* Orders this thread's generic-proxy shared-memory accesses (ordinary stores, cp.async
 * data it has observed) with later async-proxy ones (wgmma operand reads). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

/* One arrival of this thread (release: its earlier shared-memory accesses happen before
 * the phase completes for a waiter). */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* Waits until the phase of parity `parity` of the mbarrier has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

/* 16 bytes global -> shared; src_bytes 0 writes zeros. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

/* One arrival on the mbarrier once every cp.async this thread issued so far has landed
 * (the barrier's count includes it: .noinc). */
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

/* Named barriers between warpgroups: `sync` waits for `count` threads, `arrive` only
 * counts this warp in. */
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* The 32 fp32 accumulators of an m64n64 wgmma: the register list of the instruction text
 * and the matching "+f" operands (operands %0..%31). */
#define INA_WGMMA_ACC32_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
#define INA_WGMMA_ACC32_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* D[64 x 64] (+)= A[64 x 16] B[16 x 64], A and B K-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      INA_WGMMA_ACC32_REGS
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : INA_WGMMA_ACC32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* The 128 fp32 accumulators of an m64n256 wgmma: the register list of the instruction
 * text and the matching "+f" operands (operands %0..%127). */
#define INA_WGMMA_ACC128_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "

#define INA_WGMMA_ACC128_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* D[64 x 256] += A[64 x 16] B[16 x 256], A in registers (m16n8k16-style fragments per
 * warp), B MN-major (transposed) in shared memory. */
__device__ __forceinline__ void wgmma_m64n256_rs_tb(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      INA_WGMMA_ACC128_REGS
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : INA_WGMMA_ACC128_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/* D[64 x 256] += A[64 x 16] B[16 x 256], A K-major and B MN-major (transposed) in shared
 * memory. */
__device__ __forceinline__ void wgmma_m64n256_ss_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      INA_WGMMA_ACC128_REGS
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : INA_WGMMA_ACC128_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* D[64 x 64] (+)= A[64 x 16] B[16 x 64] in f16 (values converted exactly from e4m3), A and
 * B K-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n64_ss_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      INA_WGMMA_ACC32_REGS
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : INA_WGMMA_ACC32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* 64 of the 128 accumulators of an m64n256 tile, d[off .. off + 63]: those of its columns
 * [2 off, 2 off + 128), which are exactly the accumulators of an m64n128 tile there. */
#define INA_WGMMA_ACC64_OPERANDS(d, off) \
  "+f"(d[(off) + 0]), "+f"(d[(off) + 1]), "+f"(d[(off) + 2]), "+f"(d[(off) + 3]), "+f"(d[(off) + 4]), "+f"(d[(off) + 5]), "+f"(d[(off) + 6]), "+f"(d[(off) + 7]), \
  "+f"(d[(off) + 8]), "+f"(d[(off) + 9]), "+f"(d[(off) + 10]), "+f"(d[(off) + 11]), "+f"(d[(off) + 12]), "+f"(d[(off) + 13]), "+f"(d[(off) + 14]), "+f"(d[(off) + 15]), \
  "+f"(d[(off) + 16]), "+f"(d[(off) + 17]), "+f"(d[(off) + 18]), "+f"(d[(off) + 19]), "+f"(d[(off) + 20]), "+f"(d[(off) + 21]), "+f"(d[(off) + 22]), "+f"(d[(off) + 23]), \
  "+f"(d[(off) + 24]), "+f"(d[(off) + 25]), "+f"(d[(off) + 26]), "+f"(d[(off) + 27]), "+f"(d[(off) + 28]), "+f"(d[(off) + 29]), "+f"(d[(off) + 30]), "+f"(d[(off) + 31]), \
  "+f"(d[(off) + 32]), "+f"(d[(off) + 33]), "+f"(d[(off) + 34]), "+f"(d[(off) + 35]), "+f"(d[(off) + 36]), "+f"(d[(off) + 37]), "+f"(d[(off) + 38]), "+f"(d[(off) + 39]), \
  "+f"(d[(off) + 40]), "+f"(d[(off) + 41]), "+f"(d[(off) + 42]), "+f"(d[(off) + 43]), "+f"(d[(off) + 44]), "+f"(d[(off) + 45]), "+f"(d[(off) + 46]), "+f"(d[(off) + 47]), \
  "+f"(d[(off) + 48]), "+f"(d[(off) + 49]), "+f"(d[(off) + 50]), "+f"(d[(off) + 51]), "+f"(d[(off) + 52]), "+f"(d[(off) + 53]), "+f"(d[(off) + 54]), "+f"(d[(off) + 55]), \
  "+f"(d[(off) + 56]), "+f"(d[(off) + 57]), "+f"(d[(off) + 58]), "+f"(d[(off) + 59]), "+f"(d[(off) + 60]), "+f"(d[(off) + 61]), "+f"(d[(off) + 62]), "+f"(d[(off) + 63])

/* D[64 x 128] += A[64 x 16] B[16 x 128] in f16 into d[kOff .. kOff + 63] (the columns
 * [2 kOff, 2 kOff + 128) of an m64n256 accumulator set), A in registers, B MN-major
 * (transposed) in shared memory. */
template <int kOff>
__device__ __forceinline__ void wgmma_m64n128_rs_tb_f16(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(kOff == 0 || kOff == 64, "one half of an m64n256 accumulator set");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 "
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : INA_WGMMA_ACC64_OPERANDS(d, kOff)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

}  // namespace wg
}  // namespace ina_mla

#endif
