/* Expert parallelism of the CPU engine (model/expert_parallel.h). */
#define INA_LOG_SUBSYS "model"
#include "model/expert_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

ina_status_t ina_ep_group_init(ina_comm_t *comm, int32_t expert_begin, int32_t expert_end,
                               int32_t num_experts, ina_ep_group_t *out) {
  ina_status_t st = INA_OK;
  int32_t *ranges = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "expert parallelism: out is NULL");
  memset(out, 0, sizeof *out);
  out->comm = comm;
  out->nranks = comm ? ina_comm_size(comm) : 1;
  out->rank = comm ? ina_comm_rank(comm) : 0;
  ranges = malloc(2 * (size_t)out->nranks * sizeof *ranges);
  out->first_expert = malloc(((size_t)out->nranks + 1) * sizeof *out->first_expert);
  INA_CHECK_ALLOC(ranges);
  INA_CHECK_ALLOC(out->first_expert);
  {
    const int32_t mine[2] = {expert_begin, expert_end};
    if (comm) INA_CHECK(ina_comm_all_gather(comm, mine, ranges, 2, INA_DTYPE_I32, NULL));
    else memcpy(ranges, mine, sizeof mine);
  }
  /* Every rank sees the same table, so every rank reaches the same verdict. */
  out->first_expert[0] = 0;
  for (int32_t r = 0; r < out->nranks; r++) {
    const int32_t begin = ranges[2 * r], end = ranges[2 * r + 1];
    INA_REQUIRE(begin == out->first_expert[r] && end >= begin && end <= num_experts,
                INA_ERR_INVALID_ARGUMENT,
                "expert parallelism: rank %d of %d holds experts [%d, %d), but the ranks' "
                "ranges must tile [0, %d) in rank order (this one should start at %d)",
                r, out->nranks, begin, end, num_experts, out->first_expert[r]);
    out->first_expert[r + 1] = end;
  }
  INA_REQUIRE(out->first_expert[out->nranks] == num_experts, INA_ERR_INVALID_ARGUMENT,
              "expert parallelism: the %d ranks hold experts [0, %d) of %d; every expert needs "
              "a rank",
              out->nranks, out->first_expert[out->nranks], num_experts);
  free(ranges);
  return INA_OK;
fail:
  free(ranges);
  ina_ep_group_free(out);
  return st;
}

void ina_ep_group_free(ina_ep_group_t *g) {
  if (!g) return;
  free(g->first_expert);
  g->first_expert = NULL;
}

ina_status_t ina_ep_share_outputs(const ina_ep_group_t *g, const int64_t *pair_first,
                                  int64_t hidden, float *y) {
  ina_status_t st = INA_OK;
  size_t *counts = NULL, *displs = NULL, *send_counts = NULL, *send_displs = NULL;
  float *mine = NULL;
  if (!g->comm || g->nranks == 1) return INA_OK;
  const size_t n = (size_t)g->nranks;
  counts = calloc(n, sizeof *counts);
  displs = calloc(n, sizeof *displs);
  send_counts = calloc(n, sizeof *send_counts);
  send_displs = calloc(n, sizeof *send_displs);
  INA_CHECK_ALLOC(counts);
  INA_CHECK_ALLOC(displs);
  INA_CHECK_ALLOC(send_counts);
  INA_CHECK_ALLOC(send_displs);
  for (int32_t r = 0; r < g->nranks; r++) {
    const int64_t first = pair_first[g->first_expert[r]];
    const int64_t last = pair_first[g->first_expert[r + 1]];
    displs[r] = (size_t)(first * hidden);
    counts[r] = (size_t)((last - first) * hidden);
  }
  /* Our block goes to every rank; it is copied out first because it is also where our
   * own receive lands. */
  const size_t own = counts[g->rank];
  mine = malloc((own ? own : 1) * sizeof *mine);
  INA_CHECK_ALLOC(mine);
  if (own) memcpy(mine, y + displs[g->rank], own * sizeof *mine);
  for (size_t r = 0; r < n; r++) send_counts[r] = own;
  INA_CHECK(ina_comm_all_to_all_v(g->comm, mine, send_counts, send_displs, y, counts, displs,
                                  INA_DTYPE_F32, NULL));
fail:
  free(counts);
  free(displs);
  free(send_counts);
  free(send_displs);
  free(mine);
  return st;
}
