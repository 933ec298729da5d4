/* The waiting queue: a ring buffer of requests that can take new entries at both ends
 * (arrivals at the back, preempted requests at the front). Growing happens only in
 * sched_queue_reserve, at the start of a step, so the pushes inside a step cannot fail. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdlib.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

ina_status_t sched_queue_reserve(sched_queue_t *q, int32_t capacity) {
  ina_status_t st = INA_OK;
  if (capacity <= q->capacity) return INA_OK;
  int32_t grown_capacity = q->capacity * 2 > capacity ? q->capacity * 2 : capacity;
  if (grown_capacity < 16) grown_capacity = 16;
  sched_request_t **grown = malloc((size_t)grown_capacity * sizeof *grown);
  INA_CHECK_ALLOC(grown);
  for (int32_t i = 0; i < q->count; i++) grown[i] = sched_queue_at(q, i);
  free(q->items);
  q->items = grown;
  q->head = 0;
  q->capacity = grown_capacity;
fail:
  return st;
}

void sched_queue_release(sched_queue_t *q) {
  free(q->items);
  q->items = NULL;
  q->head = q->count = q->capacity = 0;
}

sched_request_t *sched_queue_at(const sched_queue_t *q, int32_t i) {
  return q->items[(q->head + i) % q->capacity];
}

void sched_queue_push_back(sched_queue_t *q, sched_request_t *r) {
  q->items[(q->head + q->count) % q->capacity] = r;
  q->count++;
}

void sched_queue_push_front(sched_queue_t *q, sched_request_t *r) {
  q->head = (q->head + q->capacity - 1) % q->capacity;
  q->items[q->head] = r;
  q->count++;
}

sched_request_t *sched_queue_pop_front(sched_queue_t *q) {
  sched_request_t *r = q->items[q->head];
  q->head = (q->head + 1) % q->capacity;
  q->count--;
  return r;
}

void sched_queue_remove_at(sched_queue_t *q, int32_t i) {
  for (int32_t k = i; k + 1 < q->count; k++)
    q->items[(q->head + k) % q->capacity] = q->items[(q->head + k + 1) % q->capacity];
  q->count--;
}
