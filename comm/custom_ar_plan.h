/* Inside comm/: the host-side decisions of the custom all-reduce (comm/custom_ar.h) that
 * need no device, so the CPU tests can check them: the layout of a rank's registered
 * allocation, which algorithm a run takes, and how the work is cut into stripes and
 * per-CTA ranges. The kernels use the same partition functions (they are plain C, compiled
 * for host and device), so a CPU model built on them follows the kernels' data flow.
 *
 * Partition. A run's elements are grouped into units: 128-element granules, or whole rows
 * when the fused epilogue is on. TWO_SHOT splits the units into nranks contiguous stripes
 * (stripe s is reduced by rank s); each stripe, and ONE_SHOT's whole range, is split again
 * into `blocks` contiguous per-CTA ranges. CTA b of every rank handles range b of every
 * stripe, in every phase, so a CTA only ever reads what the CTAs with its own index wrote
 * on the other ranks before the barrier they share. That is what makes per-CTA barriers
 * enough (no grid-wide synchronization).
 *
 * Thread safety: pure functions. */
#ifndef INA_COMM_CUSTOM_AR_PLAN_H
#define INA_COMM_CUSTOM_AR_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __CUDACC__
#define INA_CAR_HD static inline __host__ __device__
#else
#define INA_CAR_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define INA_CAR_MAX_RANKS 8
#define INA_CAR_MAX_BLOCKS 256
#define INA_CAR_THREADS 512     /* threads per CTA of every kernel */
#define INA_CAR_GRANULE 128     /* elements per unit without the epilogue; FP8 block size */
#define INA_CAR_REGION_ALIGN 4096
#define INA_CAR_MAX_COLS 16384  /* epilogue rows stay in registers: 512 threads x 8 x 4 */

/* Barrier kinds; each has its own counters. */
#define INA_CAR_FLAG_READY 0 /* inputs staged: peers may read them */
#define INA_CAR_FLAG_MID 1   /* TWO_SHOT: stripes reduced and published */
#define INA_CAR_FLAG_KINDS 2

/* Algorithm ids as in ina_custom_ar_algo_t (kept numeric here for the device code). */
#define INA_CAR_ALGO_AUTO 0
#define INA_CAR_ALGO_ONE_SHOT 1
#define INA_CAR_ALGO_TWO_SHOT 2
#define INA_CAR_ALGO_NCCL 3
#define INA_CAR_MODE_BF16 0
#define INA_CAR_MODE_F32 1
#define INA_CAR_MODE_FP8 2

/* Byte offsets inside one rank's registered allocation. Each data region holds
 * `capacity` bytes; FP8 regions keep the e4m3 values at [0, capacity/2) and the fp32
 * scales from capacity/2 on.
 *   flags     [kind][block][source rank] uint64 counters, written by the source rank
 *   epochs    [block] uint64: how many kernels CTA `block` of this rank has completed
 *   input     the caller-visible input buffer (TWO_SHOT reads the peers' inputs here)
 *   stage[2]  ONE_SHOT copies and FP8 quantized inputs, alternating by epoch parity
 *   reduced   TWO_SHOT: the stripes reduced by this rank, gathered by the others */
typedef struct ina_car_layout {
  uint64_t capacity;
  uint64_t flags, epochs, input, stage[2], reduced;
  uint64_t total;
} ina_car_layout_t;

/* capacity_bytes is rounded up to INA_CAR_REGION_ALIGN; 0 is INA_ERR_INVALID_ARGUMENT. */
ina_status_t ina_car_layout_init(uint64_t capacity_bytes, ina_car_layout_t *out);

INA_CAR_HD uint64_t ina_car_flag_offset(const ina_car_layout_t *l, int kind, int block, int src) {
  return l->flags +
         8u * (((uint64_t)kind * INA_CAR_MAX_BLOCKS + (uint64_t)block) * INA_CAR_MAX_RANKS +
               (uint64_t)src);
}
INA_CAR_HD uint64_t ina_car_epoch_offset(const ina_car_layout_t *l, int block) {
  return l->epochs + 8u * (uint64_t)block;
}
/* Where the fp32 scales of an FP8 region start, relative to the region. */
INA_CAR_HD uint64_t ina_car_fp8_scales_offset(const ina_car_layout_t *l) {
  return l->capacity / 2;
}

/* What one run does, identical on every rank. */
typedef struct ina_car_plan {
  int32_t algo;       /* INA_CAR_ALGO_ONE_SHOT or _TWO_SHOT */
  int32_t mode;       /* INA_CAR_MODE_* */
  int32_t nranks;
  int32_t blocks;     /* grid size */
  int64_t count;      /* elements */
  int64_t unit_elems; /* INA_CAR_GRANULE, or cols with the epilogue */
  int64_t units;      /* ceil(count / unit_elems) */
} ina_car_plan_t;

/* Part `i` of `parts` of [0, n): [n*i/parts, n*(i+1)/parts). Sizes differ by at most one. */
INA_CAR_HD void ina_car_split(int64_t n, int parts, int i, int64_t *begin, int64_t *end) {
  *begin = n * i / parts;
  *end = n * (i + 1) / parts;
}

/* Units [*u0, *u1) that CTA `block` handles in stripe `stripe` (TWO_SHOT), or of the whole
 * range (ONE_SHOT: stripe is ignored). */
INA_CAR_HD void ina_car_block_units(const ina_car_plan_t *p, int stripe, int block,
                                    int64_t *u0, int64_t *u1) {
  int64_t s0 = 0, s1 = p->units, b0 = 0, b1 = 0;
  if (p->algo == INA_CAR_ALGO_TWO_SHOT) ina_car_split(p->units, p->nranks, stripe, &s0, &s1);
  ina_car_split(s1 - s0, p->blocks, block, &b0, &b1);
  *u0 = s0 + b0;
  *u1 = s0 + b1;
}

/* Bytes one element of the run's input takes (2 for BF16 and FP8, 4 for F32). */
INA_CAR_HD int ina_car_in_elem_bytes(int mode) { return mode == INA_CAR_MODE_F32 ? 4 : 2; }

/* ONE_SHOT limit of AUTO when the config leaves it 0. */
size_t ina_car_default_one_shot_max_bytes(int nranks);

/* Everything the choice of algorithm depends on; equal on every rank. */
typedef struct ina_car_request {
  int mode;          /* INA_CAR_MODE_* */
  int algo;          /* requested, INA_CAR_ALGO_* */
  uint64_t count;    /* elements */
  int64_t rows, cols; /* 0 without the epilogue */
  int nranks;
  int peer_access;   /* the IPC path exists */
  int have_nccl;     /* the communicator can stand in */
  uint64_t capacity; /* bytes of a data region */
  uint64_t one_shot_max_bytes;
  int blocks;
} ina_car_request_t;

/* Validates the request's shape (mode, algo, epilogue limits), picks the algorithm and,
 * for ONE_SHOT / TWO_SHOT, fills *plan. *algo is ONE_SHOT, TWO_SHOT or NCCL. Errors:
 * INA_ERR_INVALID_ARGUMENT for a bad shape, INA_ERR_UNSUPPORTED for a combination the
 * kernels lack or a needed fallback without NCCL. The message names the value. */
ina_status_t ina_car_choose(const ina_car_request_t *r, int *algo, ina_car_plan_t *plan);

#ifdef __cplusplus
}
#endif
#endif
