/* The split of a CUDA engine step's device time by part (ina_engine_step_split): CUDA
 * events recorded on the step's stream where one part ends and the next begins.
 *
 * A step records the same marks in the same order whatever its batch (the marks follow
 * the layers, not the rows), so one array of events serves every step: an eager step
 * records them as it enqueues, a captured graph holds them as event-record nodes
 * (cudaEventRecordExternal) and records them again at each replay. After the step has
 * synchronized, the time between consecutive events is added to the part of the earlier
 * mark. Host C over the CUDA runtime. */
#define INA_LOG_SUBSYS "model"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/cuda_check.h"
#include "model/engine_gpu_internal.h"

ina_status_t gpu_split_init(gpu_split_t *s, int32_t num_layers) {
  ina_status_t st = INA_OK;
  /* Per layer at most 8 (norm, attention, norm, MoE, its gathers, MoE, the experts' sum,
   * MoE); the embedding, the head, the logits' gather and copy and the end add 5. */
  s->cap = 10 * num_layers + 16;
  s->events = calloc((size_t)s->cap, sizeof *s->events);
  s->part = calloc((size_t)s->cap, sizeof *s->part);
  INA_CHECK_ALLOC(s->events);
  INA_CHECK_ALLOC(s->part);
  for (int32_t i = 0; i < s->cap; i++) INA_CUDA_CHECK(cudaEventCreate(&s->events[i]));
  s->on = 1;
fail:
  return st;
}

void gpu_split_free(gpu_split_t *s) {
  for (int32_t i = 0; s->events && i < s->cap; i++)
    if (s->events[i]) cudaEventDestroy(s->events[i]);
  free(s->events);
  free(s->part);
  memset(s, 0, sizeof *s);
}

void gpu_split_begin(gpu_split_t *s) { s->count = 0; }

ina_status_t gpu_split_mark(gpu_split_t *s, gpu_split_part_t part, cudaStream_t stream) {
  ina_status_t st = INA_OK;
  if (!s->on) return INA_OK;
  INA_REQUIRE(s->count < s->cap, INA_ERR_INTERNAL, "step split: more than %d marks in a step", s->cap);
  s->part[s->count] = (uint8_t)part;
  /* In a capture the event must become a record node of the graph (External); outside
   * one that flag is refused. */
  enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  INA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing == cudaStreamCaptureStatusActive)
    INA_CUDA_CHECK(cudaEventRecordWithFlags(s->events[s->count], stream, cudaEventRecordExternal));
  else
    INA_CUDA_CHECK(cudaEventRecord(s->events[s->count], stream));
  s->count++;
fail:
  return st;
}

ina_status_t gpu_split_end_step(gpu_split_t *s) {
  ina_status_t st = INA_OK;
  if (!s->on || s->count < 2) return INA_OK;
  for (int32_t i = 0; i + 1 < s->count; i++) {
    float ms = 0;
    INA_CUDA_CHECK(cudaEventElapsedTime(&ms, s->events[i], s->events[i + 1]));
    s->ms[s->part[i]] += ms;
  }
  s->steps++;
fail:
  return st;
}

ina_status_t ina_engine_gpu_step_split(ina_engine_gpu_t *e, int reset, ina_engine_step_split_t *out) {
  ina_status_t st = INA_OK;
  gpu_split_t *s = &e->split;
  INA_REQUIRE(s->on, INA_ERR_UNSUPPORTED, "step split: the engine was created without step_split");
  out->steps = s->steps;
  out->attention_ms = s->ms[SPLIT_ATTENTION];
  out->moe_ms = s->ms[SPLIT_MOE];
  out->ep_comm_ms = s->ms[SPLIT_EP_COMM];
  out->tp_comm_ms = s->ms[SPLIT_TP_COMM];
  out->other_ms = s->ms[SPLIT_OTHER];
  if (reset) {
    memset(s->ms, 0, sizeof s->ms);
    s->steps = 0;
  }
fail:
  return st;
}
