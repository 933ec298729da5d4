/* Expert placement changes of the CPU engine (ina_engine_apply_placement in model.h).
 *
 * Every rank of the engine (its expert-parallel group and, with tensor parallelism, the
 * other slices' groups too) takes the same steps, and every decision is a vote over all
 * of them, so all ranks take the same branch: agree on p and check it, check memory,
 * move the experts into a new slot set beside the old one, then commit or roll back. */
#define INA_LOG_SUBSYS "model"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "model/engine_cpu_internal.h"

/* *v summed over comm's ranks (the sum all-reduce is for floats; integers are gathered). */
static ina_status_t comm_sum(ina_comm_t *comm, int64_t *v) {
  ina_status_t st = INA_OK;
  int64_t *all = NULL;
  if (!comm) return INA_OK;
  all = malloc((size_t)ina_comm_size(comm) * sizeof *all);
  INA_CHECK_ALLOC(all);
  INA_CHECK(ina_comm_all_gather(comm, v, all, 1, INA_DTYPE_I64, NULL));
  *v = 0;
  for (int r = 0; r < ina_comm_size(comm); r++) *v += all[r];
fail:
  free(all);
  return st;
}

/* Sum of v over every rank of the engine. */
static ina_status_t engine_sum(ina_engine_cpu_t *e, int64_t *v) {
  ina_status_t st = INA_OK;
  INA_CHECK(comm_sum(e->ep.comm, v));
  INA_CHECK(comm_sum(e->tp_comm, v));
fail:
  return st;
}

/* Rank 0's digest of the engine grid (rank 0 of every communicator). */
static ina_status_t root_digest(ina_engine_cpu_t *e, uint64_t mine, uint64_t *out) {
  ina_status_t st = INA_OK;
  int64_t d = (int64_t)mine;
  if (e->ep.comm) INA_CHECK(ina_comm_broadcast(e->ep.comm, &d, 1, INA_DTYPE_I64, 0, NULL));
  if (e->tp_comm) INA_CHECK(ina_comm_broadcast(e->tp_comm, &d, 1, INA_DTYPE_I64, 0, NULL));
  *out = (uint64_t)d;
fail:
  return st;
}

/* Host memory the kernel says can be had without swapping. */
static int64_t available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  long long kb = -1;
  if (f) {
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
  }
  if (kb >= 0) return (int64_t)kb * 1024;
  return (int64_t)sysconf(_SC_AVPHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
}

/* The local verdict on p's shape and contents, with its message. */
static ina_status_t check_locally(const ina_engine_cpu_t *e, const ina_expert_placement_t *p,
                                  ina_ep_group_t *tables) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p->slot_expert != NULL, INA_ERR_INVALID_ARGUMENT, "expert placement: empty");
  INA_REQUIRE(p->ep == e->ep.nranks, INA_ERR_INVALID_ARGUMENT,
              "expert placement: ep is %d, but %d ranks share the experts", p->ep, e->ep.nranks);
  INA_REQUIRE(p->num_moe_layers == e->num_moe_layers && p->num_experts == e->cfg->n_routed_experts,
              INA_ERR_INVALID_ARGUMENT,
              "expert placement: %d MoE layers of %d experts, but the model has %d of %d",
              p->num_moe_layers, p->num_experts, e->num_moe_layers, e->cfg->n_routed_experts);
  INA_CHECK(ina_ep_group_prepare(&e->ep, p, tables));
fail:
  return st;
}

/* Does p fit on this rank? Sets *needed to the bytes it would receive. */
static ina_status_t check_memory(const ina_engine_cpu_t *e, const ina_expert_placement_t *p,
                                 const int64_t *expert_bytes, int64_t *needed) {
  ina_status_t st = INA_OK;
  int64_t held = 0;
  *needed = ina_expert_slots_incoming_bytes(&e->ep.placement, p, e->ep.rank, expert_bytes);
  for (int32_t m = 0; m < p->num_moe_layers; m++)
    for (int32_t s = 0; s < p->slots_per_rank; s++)
      if (ina_expert_placement_slot(p, m, e->ep.rank, s) >= 0) held += expert_bytes[m];
  INA_REQUIRE(e->max_expert_bytes <= 0 || held <= e->max_expert_bytes, INA_ERR_OUT_OF_MEMORY,
              "expert placement: rank %d would hold %.1f MiB of routed experts, over its limit "
              "of %.1f MiB (max_expert_bytes)",
              e->ep.rank, (double)held / 1048576.0, (double)e->max_expert_bytes / 1048576.0);
  const int64_t available = available_bytes();
  INA_REQUIRE(*needed <= available, INA_ERR_OUT_OF_MEMORY,
              "expert placement: rank %d would receive %.1f MiB of experts, and %.1f MiB of "
              "memory is available",
              e->ep.rank, (double)*needed / 1048576.0, (double)available / 1048576.0);
fail:
  return st;
}

/* When another rank failed a stage this rank passed. */
static ina_status_t refused_elsewhere(const char *stage, ina_status_t code) {
  ina_error(INA_LOG_SUBSYS, "expert placement: another rank failed %s (see its log); nothing "
            "changed", stage);
  return code;
}

ina_status_t ina_engine_cpu_apply_placement(ina_engine_cpu_t *e, const ina_expert_placement_t *p,
                                            int dry_run, int64_t *bytes_moved) {
  ina_status_t st = INA_OK, local = INA_OK;
  ina_ep_group_t tables = {0};
  ina_expert_slots_t slots = {0};
  int64_t *expert_bytes = NULL, failures = 0, received = 0;
  uint64_t digest = 0;
  *bytes_moved = 0;

  /* 1. The same valid placement everywhere. */
  local = check_locally(e, p, &tables);
  expert_bytes = calloc((size_t)e->num_moe_layers + 1, sizeof *expert_bytes);
  if (local == INA_OK && !expert_bytes) {
    ina_error(INA_LOG_SUBSYS, "expert placement: out of memory");
    local = INA_ERR_OUT_OF_MEMORY;
  }
  INA_CHECK(root_digest(e, local == INA_OK ? ina_expert_placement_digest(p) : 0, &digest));
  if (local == INA_OK && digest != ina_expert_placement_digest(p)) {
    ina_error(INA_LOG_SUBSYS, "expert placement: rank %d was given another placement than rank 0",
              e->ep.rank);
    local = INA_ERR_INVALID_ARGUMENT;
  }
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  if (failures) {
    st = local != INA_OK ? local : refused_elsewhere("the placement check", INA_ERR_INVALID_ARGUMENT);
    goto fail;
  }

  /* 2. Room for the experts each rank receives. */
  INA_CHECK(ina_expert_slots_expert_bytes(&e->slots, e->ep.comm, expert_bytes));
  local = check_memory(e, p, expert_bytes, bytes_moved);
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  INA_CHECK(engine_sum(e, bytes_moved));
  if (failures) {
    st = local != INA_OK ? local : refused_elsewhere("the memory check", INA_ERR_OUT_OF_MEMORY);
    goto fail;
  }
  if (dry_run) goto fail;

  /* 3. The new slots beside the old ones. A communicator failure ends the job. */
  local = ina_expert_slots_move(e->ep.comm, e->ep.rank, &e->ep.placement, &e->slots, p, &slots,
                                &received);
  if (e->ep.comm && ina_comm_is_broken(e->ep.comm)) {
    st = local;
    goto fail;
  }
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  if (failures) {
    /* A failed move released its slots already; a rank that succeeded drops its new ones. */
    ina_expert_slots_release(&slots, &e->slots);
    st = local != INA_OK ? local : refused_elsewhere("the expert move", INA_ERR_OUT_OF_MEMORY);
    goto fail;
  }

  /* 4. Commit: nothing below can fail. */
  ina_ep_group_swap(&e->ep, &tables);
  ina_expert_slots_release(&e->slots, &slots);
  e->slots = slots;
  *bytes_moved = received;
  INA_CHECK(engine_sum(e, bytes_moved));
fail:
  ina_ep_group_free(&tables);
  free(expert_bytes);
  return st;
}

ina_status_t ina_engine_cpu_get_placement(ina_engine_cpu_t *e, ina_expert_placement_t *out) {
  return ina_expert_placement_copy(&e->ep.placement, out);
}
