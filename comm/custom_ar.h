/* Custom intra-node all-reduce over CUDA IPC, with an FP8 transport and a fused
 * residual-add + RMSNorm epilogue; capturable in CUDA graphs.
 *
 * Every rank of a communicator whose ranks share one node (one GPU each) exports one
 * device allocation with cudaIpcGetMemHandle at creation; the handles are exchanged over
 * the communicator's MPI ranks and each rank maps its peers' allocations once
 * (cudaIpcOpenMemHandle), until destruction. Kernels then read the peers' memory directly
 * over NVLink and synchronize through counters in that memory.
 *
 * Algorithms (ina_custom_ar_algo_t):
 *   LL        low-latency one-shot: every rank writes its whole input into every peer's
 *             memory as 16-byte lines of 8 data bytes and two flag words carrying the run's
 *             counter, and sums its own input with the lines it receives once their flags
 *             match: no barrier and no remote read, (n-1) x 2 x bytes written per rank; for
 *             messages up to 1 MiB (asked for larger, it takes ONE_SHOT). BF16 and F32.
 *   ONE_SHOT  every rank reads every peer's whole input and sums it: one barrier, (n-1) x
 *             bytes read per rank; best for small messages.
 *   TWO_SHOT  reduce-scatter then all-gather: rank s reduces stripe s (1/n of the data) from
 *             every rank and publishes it, then every rank gathers the n stripes: two
 *             barriers, 2 (n-1)/n x bytes read per rank; best for large messages. In FP8
 *             mode the data moves by remote writes instead: each rank pushes its quantized
 *             share of stripe s to rank s, and rank s pushes the re-quantized sum to every
 *             rank, so all reads are local.
 *   NCCL      the communicator's NCCL all-reduce (fallback).
 * AUTO picks LL up to 256 KiB (128 KiB with the epilogue; BF16, F32), then ONE_SHOT up to
 * the config's one_shot_max_bytes and TWO_SHOT above it. Every
 * run falls back to NCCL, whatever was asked, when the peers cannot access each other
 * (cudaDeviceCanAccessPeer, or the ranks are not on one node, or more than 8 ranks) or the
 * message does not fit the registered buffers (max_bytes). Peers are found by PCI bus id,
 * so each rank must see the other ranks' GPUs (do not narrow CUDA_VISIBLE_DEVICES to one
 * GPU per process; the bootstrap picks the device by local rank). A fallback needs a
 * communicator with the NCCL backend; with an MPI communicator it is INA_ERR_UNSUPPORTED.
 * The choice depends only on values every rank passes alike (mode, count, rows, cols, algo
 * and the config), so all ranks take the same path. ina_custom_ar_choose says which.
 *
 * Modes (ina_custom_ar_mode_t):
 *   BF16  bf16 in and out; the sum is formed in fp32 in rank order 0, 1, ..., n-1 and
 *         rounded once to bf16.
 *   F32   f32 in and out; fp32 sum in rank order.
 *   FP8   bf16 in and out, FP8 e4m3 on the wire (half the bytes of BF16): each rank
 *         quantizes its input in blocks of 128 consecutive elements (scale_inv = amax / 448,
 *         q = e4m3_satfinite(x / scale_inv), as ina_fp8_quantize_blocks), the owner of a
 *         stripe dequantizes and sums in fp32 in rank order, re-quantizes the reduced
 *         stripe the same way, and every rank dequantizes it to bf16. TWO_SHOT only (AUTO
 *         picks it; ONE_SHOT and LL are INA_ERR_UNSUPPORTED); its NCCL fallback is a bf16
 *         all-reduce.
 *         Error: per element at most about 2^-4 (sum of the ranks' block amax) + 2^-4 (block
 *         amax of the sum), i.e. two e4m3 roundings relative to the 128-block max.
 * Results are bitwise identical on every rank (the owner reduces each stripe once and the
 * others copy it; in LL and ONE_SHOT every rank sums in the same order), and for BF16 and
 * F32 LL, ONE_SHOT and TWO_SHOT give identical bits. NCCL runs are NCCL's numerics.
 *
 * Fused epilogue (BF16 and FP8 modes, when args->norm_weight is set), per row of the
 * [rows, cols] result, as ina_gpu_rmsnorm (gpu_ops/gpu_ops.h) on the all-reduced bf16 sum x:
 *     residual = bf16(residual + x)                  (skipped when residual is NULL)
 *     out      = bf16(rmsnorm(residual) * weight)    (fp32 math, fixed reduction order)
 *     y_fp8, y_scale_inv = 1 x 128 block quantization of out (optional), bit-identical to
 *                          ina_cuda_fp8_quantize_blocks(out): scales [rows, ceil(cols/128)].
 *
 * Buffers. ina_custom_ar_input_buffer is this rank's registered input buffer (max_bytes):
 * a producer that writes its result there (args->in == that pointer) saves TWO_SHOT a copy;
 * any other `in` is copied inside the kernel. args->in and args->out are device pointers
 * of count elements, each either the input buffer itself or memory outside it; out may
 * equal in; other overlaps are not allowed.
 *
 * Stream and graph rules. ina_custom_ar_run enqueues on args->stream and returns: no host
 * synchronization, no allocation, a fixed grid (the smallest SM count of the ranks, capped
 * by max_blocks), so runs can be captured in CUDA graphs and replayed any number of times
 * with new data (written into the same `in` before each replay); the synchronization
 * counters only grow, so nothing is reset between replays. Runs of one instance must be
 * ordered: issue them on one stream (or streams ordered by events), eager and replayed
 * alike, and every rank must issue the same sequence of runs. Do not run two instances, or
 * another blocking collective, concurrently on other streams: kernels that wait for peers
 * must all be resident at once.
 *
 * Failure behaviour. Argument errors are reported before anything is enqueued. A kernel
 * that waits longer than the timeout for a peer (a dead peer, or ranks that disagree on
 * the sequence of runs) records which wait it was and traps, which leaves the CUDA context
 * unusable: the next ina_custom_ar_run returns INA_ERR_CUDA naming the rank, block, peer
 * and run. Checked mode (config.check) exchanges a small header (mode, algo, count, rows,
 * cols, epilogue) over MPI before each run and fails on every rank with
 * INA_ERR_INVALID_ARGUMENT, naming the disagreeing rank, instead of hanging; it costs one
 * host all-gather per run, is skipped during graph replay, and is meant for debugging.
 *
 * Ownership: the caller owns the instance and destroys it before the communicator it was
 * made from. Thread safety: one thread at a time per instance, and not concurrently with
 * other calls on its communicator (NCCL fallbacks use it). */
#ifndef INA_COMM_CUSTOM_AR_H
#define INA_COMM_CUSTOM_AR_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_custom_ar ina_custom_ar_t;

typedef enum ina_custom_ar_mode {
  INA_CUSTOM_AR_BF16 = 0,
  INA_CUSTOM_AR_F32 = 1,
  INA_CUSTOM_AR_FP8 = 2,
} ina_custom_ar_mode_t;

typedef enum ina_custom_ar_algo {
  INA_CUSTOM_AR_AUTO = 0,
  INA_CUSTOM_AR_ONE_SHOT = 1,
  INA_CUSTOM_AR_TWO_SHOT = 2,
  INA_CUSTOM_AR_NCCL = 3,
  INA_CUSTOM_AR_LL = 4,
} ina_custom_ar_algo_t;

/* Settings; every rank must pass the same values (checked at creation). */
typedef struct ina_custom_ar_config {
  size_t struct_size; /* sizeof(ina_custom_ar_config_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  /* Largest input of one run in bytes (count x 2 for BF16 and FP8, x 4 for F32, rounded
   * up to 128 elements). Device memory per rank: about 4.5 x max_bytes, plus 4 x nranks x
   * min(max_bytes, 1 MiB) of LL lines. */
  size_t max_bytes;
  /* AUTO takes ONE_SHOT up to this many input bytes, TWO_SHOT above. 0 = the default for
   * the rank count: 8 MiB for 2 ranks, 512 KiB for 3-4, 256 KiB for 5-8. */
  size_t one_shot_max_bytes;
  /* Upper bound on the grid (CTAs per kernel); 0 = the smallest SM count of the ranks. */
  int32_t max_blocks;
  /* Checked mode: 1 on, 0 off, -1 = from INA_COMM_CHECK (as comm.h). */
  int32_t check;
  /* Seconds a kernel may wait for a peer before it traps; 0 waits forever; < 0 = from
   * INA_COMM_TIMEOUT_S (default 60, as comm.h). */
  double timeout_s;
} ina_custom_ar_config_t;

#define INA_CUSTOM_AR_CONFIG_INIT                                                        \
  {sizeof(ina_custom_ar_config_t), 1, (size_t)32 << 20, 0, 0, -1, -1.0}

/* One all-reduce. With the epilogue (norm_weight != NULL) count = rows * cols. */
typedef struct ina_custom_ar_args {
  size_t struct_size;        /* sizeof(ina_custom_ar_args_t), set by the INIT macro */
  uint32_t version;          /* 1 */
  ina_custom_ar_mode_t mode; /* BF16, F32 or FP8 */
  ina_custom_ar_algo_t algo; /* AUTO, or a preference (still falls back to NCCL, see above) */
  size_t count;              /* elements per rank; 0 enqueues nothing */
  const void *in;            /* device, count elements (bf16 for BF16/FP8, f32 for F32) */
  void *out;                 /* device, count elements: the sum, or the normalized rows */
  /* ---- fused epilogue: BF16 and FP8 modes; off when norm_weight is NULL ---- */
  int64_t rows;              /* >= 1 */
  int64_t cols;              /* multiple of 8, 8 .. 16384; FP8 mode: multiple of 128 */
  uint16_t *residual;        /* bf16 [rows, cols], read and written; NULL = no residual add */
  const void *norm_weight;   /* [cols], 16-byte aligned */
  ina_dtype_t norm_weight_dtype; /* INA_DTYPE_BF16 or INA_DTYPE_F32 */
  float eps;                 /* finite, >= 0 */
  uint8_t *y_fp8;            /* e4m3 [rows, cols], 8-byte aligned; NULL = none */
  float *y_scale_inv;        /* [rows, ceil(cols / 128)]; with y_fp8 */
  /* With the epilogue, out and residual must be 16-byte aligned and must not overlap
   * each other or y_fp8. */
  void *stream; /* cudaStream_t; NULL = the legacy default stream */
} ina_custom_ar_args_t;

#define INA_CUSTOM_AR_ARGS_INIT                                                          \
  {sizeof(ina_custom_ar_args_t), 1, INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_AUTO, 0, NULL, NULL, \
   0, 0, NULL, NULL, INA_DTYPE_BF16, 1e-6f, NULL, NULL, NULL}

/* Collective over `comm`'s ranks, which must be on one node with one GPU each (the
 * current CUDA device of each rank is used). `comm` may have the MPI or the NCCL backend;
 * only NCCL allows fallbacks. It must outlive the instance. cfg may be NULL (defaults).
 * Creation succeeds without peer access when NCCL can stand in (every run then falls
 * back); otherwise INA_ERR_UNSUPPORTED. Builds without CUDA: INA_ERR_UNSUPPORTED. On
 * failure *out = NULL. */
ina_status_t ina_custom_ar_create(ina_comm_t *comm, const ina_custom_ar_config_t *cfg,
                                  ina_custom_ar_t **out);
/* Collective. Waits for the device, then for every rank, before unmapping the peers'
 * memory and freeing its own. Graphs that captured runs must not be launched afterwards.
 * NULL is a no-op. */
void ina_custom_ar_destroy(ina_custom_ar_t *ar);

/* This rank's registered input buffer (device memory owned by the instance) and its size
 * in bytes (max_bytes rounded up); NULL and 0 when the instance has no peer access (every
 * run uses NCCL). Valid until destroy. */
void *ina_custom_ar_input_buffer(const ina_custom_ar_t *ar, size_t *bytes);
/* 1 when the IPC path is usable, 0 when every run falls back to NCCL. */
int ina_custom_ar_peer_access(const ina_custom_ar_t *ar);
int ina_custom_ar_nranks(const ina_custom_ar_t *ar);
/* The algorithm a run with these values would take (LL, ONE_SHOT, TWO_SHOT or NCCL), in
 * *algo; rows and cols are 0 without the epilogue. Errors as ina_custom_ar_run would
 * report for them (unsupported combinations). */
ina_status_t ina_custom_ar_choose(const ina_custom_ar_t *ar, ina_custom_ar_mode_t mode,
                                  ina_custom_ar_algo_t requested, size_t count, int64_t rows,
                                  int64_t cols, ina_custom_ar_algo_t *algo);

/* Enqueues one all-reduce (see the top of this header). Collective: every rank of the
 * communicator calls it with the same mode, algo, count and epilogue shape. */
ina_status_t ina_custom_ar_run(ina_custom_ar_t *ar, const ina_custom_ar_args_t *args);

#ifdef __cplusplus
}
#endif
#endif
