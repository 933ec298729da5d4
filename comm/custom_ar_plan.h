/* Inside comm/: the host-side decisions of the custom all-reduce (comm/custom_ar.h) that
 * need no device, so the CPU tests can check them: the layout of a rank's registered
 * allocation, which algorithm a run takes, and how the work is cut into stripes and
 * per-CTA ranges. The kernels use the same partition functions (they are plain C, compiled
 * for host and device), so a CPU model built on them follows the kernels' data flow.
 *
 * Partition. A run's elements are grouped into units: 128-element granules, or whole rows
 * when the fused epilogue is on. TWO_SHOT splits the units into nranks contiguous stripes
 * (stripe s is reduced by rank s); each stripe, and the whole range of ONE_SHOT and LL, is
 * split again into `blocks` contiguous per-CTA ranges. CTA b of every rank handles range b
 * of every stripe, in every phase, so a CTA only ever reads what the CTAs with its own
 * index wrote (into its memory or theirs) before the barrier they share, or (LL) into the
 * lines it polls. That is what makes per-CTA synchronization enough (no grid-wide
 * synchronization).
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
/* LL: the largest padded input it takes, and its line: 8 payload bytes + 2 flag words. */
#define INA_CAR_LL_MAX_BYTES ((uint64_t)1 << 20)
#define INA_CAR_LL_LINE_BYTES 16
#define INA_CAR_LL_PAYLOAD_BYTES 8

/* Barrier kinds; each has its own counters. */
#define INA_CAR_FLAG_READY 0 /* inputs staged: peers may read them */
#define INA_CAR_FLAG_MID 1   /* TWO_SHOT: stripes reduced and published */
#define INA_CAR_FLAG_KINDS 2
#define INA_CAR_WAIT_LL 2    /* watchdog kind of an LL line wait (LL has no counters) */

/* Algorithm ids as in ina_custom_ar_algo_t (kept numeric here for the device code). */
#define INA_CAR_ALGO_AUTO 0
#define INA_CAR_ALGO_ONE_SHOT 1
#define INA_CAR_ALGO_TWO_SHOT 2
#define INA_CAR_ALGO_NCCL 3
#define INA_CAR_ALGO_LL 4
#define INA_CAR_MODE_BF16 0
#define INA_CAR_MODE_F32 1
#define INA_CAR_MODE_FP8 2

/* Byte offsets inside one rank's registered allocation. Each data region holds
 * `capacity` bytes; FP8 regions keep the e4m3 values at [0, capacity/2) and the fp32
 * scales from capacity/2 on (element e's value at e, its scale at e / 128).
 *   flags     [kind][block][source rank] uint64 counters, written by the source rank
 *   epochs    [block] uint64: how many kernels CTA `block` of this rank has completed
 *   ll[2]     LL receive lines [source rank][line], alternating by epoch parity: line k of
 *             source s carries payload bytes [8k, 8k + 8) of rank s's input as
 *             {word 0, flag, word 1, flag}; zero when consumed
 *   input     the caller-visible input buffer (TWO_SHOT reads the peers' inputs here)
 *   stage[2]  ONE_SHOT copies of the input, alternating by epoch parity
 *   fp8_recv  FP8 TWO_SHOT: [source rank] slots of fp8_slot_bytes, each the source's
 *             quantized share of this rank's stripe (stripe-relative: values at
 *             e - stripe start, scales from fp8_slot_elems on)
 *   reduced   TWO_SHOT: the stripes this rank reduced (bf16/f32, gathered by the others);
 *             FP8: every stripe, re-quantized, written by its owner (an FP8 region)
 * Everything before `input` is zero at creation. */
typedef struct ina_car_layout {
  uint64_t capacity;
  uint64_t flags, epochs, ll[2], input, stage[2], fp8_recv, reduced;
  uint64_t ll_capacity;    /* payload bytes per source in each ll region */
  uint64_t fp8_slot_elems; /* elements one fp8_recv slot holds (a whole stripe) */
  uint64_t fp8_slot_bytes;
  uint64_t total;
} ina_car_layout_t;

/* capacity_bytes is rounded up to INA_CAR_REGION_ALIGN; 0 is INA_ERR_INVALID_ARGUMENT, as
 * are nranks outside [1, INA_CAR_MAX_RANKS]. */
ina_status_t ina_car_layout_init(uint64_t capacity_bytes, int nranks, ina_car_layout_t *out);

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
/* The LL lines that source rank `src` writes for epoch parity `parity`. */
INA_CAR_HD uint64_t ina_car_ll_slot(const ina_car_layout_t *l, int parity, int src) {
  return l->ll[parity & 1] + (uint64_t)src * (l->ll_capacity / INA_CAR_LL_PAYLOAD_BYTES) *
                                 INA_CAR_LL_LINE_BYTES;
}
/* The fp8_recv slot that source rank `src` fills. */
INA_CAR_HD uint64_t ina_car_fp8_recv_slot(const ina_car_layout_t *l, int src) {
  return l->fp8_recv + (uint64_t)src * l->fp8_slot_bytes;
}

/* What one run does, identical on every rank. */
typedef struct ina_car_plan {
  int32_t algo;       /* INA_CAR_ALGO_ONE_SHOT, _TWO_SHOT or _LL */
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

/* Units [*s0, *s1) of stripe `stripe` (TWO_SHOT), or all of them (ONE_SHOT, LL). */
INA_CAR_HD void ina_car_stripe_units(const ina_car_plan_t *p, int stripe, int64_t *s0,
                                     int64_t *s1) {
  *s0 = 0;
  *s1 = p->units;
  if (p->algo == INA_CAR_ALGO_TWO_SHOT) ina_car_split(p->units, p->nranks, stripe, s0, s1);
}

/* Units [*u0, *u1) that CTA `block` handles in stripe `stripe` (TWO_SHOT), or of the whole
 * range (ONE_SHOT, LL: stripe is ignored). */
INA_CAR_HD void ina_car_block_units(const ina_car_plan_t *p, int stripe, int block,
                                    int64_t *u0, int64_t *u1) {
  int64_t s0 = 0, s1 = 0, b0 = 0, b1 = 0;
  ina_car_stripe_units(p, stripe, &s0, &s1);
  ina_car_split(s1 - s0, p->blocks, block, &b0, &b1);
  *u0 = s0 + b0;
  *u1 = s0 + b1;
}

/* Bytes one element of the run's input takes (2 for BF16 and FP8, 4 for F32). */
INA_CAR_HD int ina_car_in_elem_bytes(int mode) { return mode == INA_CAR_MODE_F32 ? 4 : 2; }

/* ONE_SHOT limit of AUTO when the config leaves it 0. */
size_t ina_car_default_one_shot_max_bytes(int nranks);
/* AUTO takes LL (bf16 and f32) up to this many input bytes, within the LL capacity;
 * epilogue != 0 for runs with the fused epilogue. */
size_t ina_car_ll_auto_max_bytes(int nranks, int epilogue);

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
  uint64_t ll_capacity; /* LL payload bytes per source (layout.ll_capacity) */
  uint64_t one_shot_max_bytes;
  int blocks;
} ina_car_request_t;

/* Validates the request's shape (mode, algo, epilogue limits), picks the algorithm and,
 * for ONE_SHOT / TWO_SHOT / LL, fills *plan. *algo is ONE_SHOT, TWO_SHOT, LL or NCCL. LL
 * asked for a run larger than the LL lines hold takes ONE_SHOT. Errors:
 * INA_ERR_INVALID_ARGUMENT for a bad shape, INA_ERR_UNSUPPORTED for a combination the
 * kernels lack or a needed fallback without NCCL. The message names the value. */
ina_status_t ina_car_choose(const ina_car_request_t *r, int *algo, ina_car_plan_t *plan);

#ifdef __cplusplus
}
#endif
#endif
