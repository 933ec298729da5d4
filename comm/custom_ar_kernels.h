/* Inside comm/: the launchers of the custom all-reduce kernels (comm/custom_ar.cu), called
 * by the host code (comm/custom_ar.c). Plain C.
 *
 * Thread safety: as the CUDA runtime. */
#ifndef INA_COMM_CUSTOM_AR_KERNELS_H
#define INA_COMM_CUSTOM_AR_KERNELS_H

#include <stdint.h>

#include "comm/custom_ar_plan.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Written by a kernel whose wait for a peer timed out, just before it traps. Lives in
 * mapped pinned host memory, so the host can still read it after the context is lost. */
typedef struct ina_car_watchdog {
  volatile uint32_t tripped; /* set last */
  int32_t rank, block, peer, kind;
  uint64_t epoch;            /* the counter value waited for */
  uint64_t seen;             /* the value last read */
} ina_car_watchdog_t;

typedef struct ina_car_kernel_args {
  ina_car_plan_t plan;
  ina_car_layout_t layout;
  /* Every rank's registered allocation as mapped in this process (base[rank] is ours). */
  uint8_t *base[INA_CAR_MAX_RANKS];
  int32_t rank;
  /* TWO_SHOT bf16/f32: `in` is our input region itself, so nothing is copied in. */
  int32_t zero_copy;
  /* in / out are 16-byte aligned: whole vectors, else element by element. */
  int32_t in_aligned, out_aligned;
  int32_t in_place; /* in == out */
  const void *in; /* count elements (bf16 for BF16 and FP8, f32 for F32) */
  void *out;      /* count elements; with the epilogue the normalized rows (16-byte aligned) */
  /* Fused epilogue (plan.unit_elems == cols). */
  int32_t epilogue;
  int64_t cols;
  uint16_t *residual;  /* NULL = no residual add; 16-byte aligned */
  const void *weight;  /* [cols], 16-byte aligned */
  int32_t weight_f32;
  float eps;
  uint8_t *y_fp8;      /* NULL = none; 8-byte aligned */
  float *y_scale_inv;
  uint64_t timeout_ns; /* 0 = wait forever */
  ina_car_watchdog_t *watchdog; /* device view of the mapped record */
} ina_car_kernel_args_t;

/* Enqueues the all-reduce kernel of a->plan (grid a->plan.blocks, INA_CAR_THREADS threads). */
ina_status_t ina_car_launch(const ina_car_kernel_args_t *a, void *stream);

/* The epilogue alone over `rows` rows of a->out (already all-reduced, e.g. by NCCL),
 * in place: reads a->out as x, writes the normalized rows back, updates the residual and
 * writes the FP8 output. Uses cols, residual, weight, weight_f32, eps, y_fp8, y_scale_inv. */
ina_status_t ina_car_launch_epilogue(const ina_car_kernel_args_t *a, int64_t rows, void *stream);

/* The fewest CTAs of any all-reduce kernel that fit on one SM together (>= 1 is needed
 * for the grid to be resident at once); 0 when it cannot be determined. */
int ina_car_min_blocks_per_sm(void);

#ifdef __cplusplus
}
#endif
#endif
