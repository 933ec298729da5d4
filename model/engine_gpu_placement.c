/* Expert placements of the CUDA engine (ina_engine_apply_placement in model.h).
 *
 * With expert parallelism every rank runs the one-GPU permutation of each MoE layer's
 * (token, k) entries by expert; a rank computes the rows of its slots: slot s holding
 * expert x as replica j of R takes run j of x's entries (ina_gpu_moe_slot_rows, the CPU
 * engine's cut), and the grouped GEMM runs over the slots' scattered row ranges. The
 * expert outputs are then all-reduced over the group (engine_gpu.c), so a placement
 * changes who computes a row, never its value.
 *
 * A change follows the CPU engine's steps (engine_cpu_placement.c): agree on p and check
 * it, check device memory, move the experts a rank lacks from the lowest rank holding
 * them (all-to-alls of device memory over the expert-parallel communicator, in rounds of
 * at most 512 MiB per rank),
 * then every rank commits or every rank rolls back. Votes and digests travel through the
 * communicators' device buffers (NCCL). */
#define INA_LOG_SUBSYS "model"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/cuda_check.h"
#include "model/engine_gpu_internal.h"

enum { PARTS = 6 }; /* gate, up, down: weight and scales each */

/* ---- the slot tables ----------------------------------------------------------------- */

static gpu_linear_t *mlp_part(gpu_mlp_t *m, int i) { return i == 0 ? &m->gate : i == 1 ? &m->up : &m->down; }

/* Expert x's replicas in p's layer m: *count, and the index of (rank, slot) among them in
 * (rank, slot) order (-1 when that slot does not hold x). */
static int32_t replica_of(const ina_expert_placement_t *p, int32_t m, int32_t x, int32_t rank, int32_t slot,
                          int32_t *count) {
  int32_t n = 0, mine = -1;
  for (int32_t r = 0; r < p->ep; r++)
    for (int32_t s = 0; s < p->slots_per_rank; s++)
      if (ina_expert_placement_slot(p, m, r, s) == x) {
        if (r == rank && s == slot) mine = n;
        n++;
      }
  *count = n;
  return mine;
}

static void slot_layer_free(gpu_slot_layer_t *L, const gpu_slot_layer_t *keep) {
  if (!L) return;
  for (int32_t i = 0; L->owned && i < L->slots * PARTS; i++) {
    int shared = 0;
    for (int32_t k = 0; keep && keep->owned && k < keep->slots * PARTS && !shared; k++)
      shared = keep->owned[k] == L->owned[i];
    if (L->owned[i] && !shared) cudaFree(L->owned[i]);
  }
  if (L->tables_owned)
    for (int i = 0; i < 3; i++) {
      cudaFree((void *)L->tab_w[i]);
      cudaFree((void *)L->tab_s[i]);
    }
  cudaFree(L->info_dev);
  free(L->w);
  free(L->owned);
  free(L->info);
  memset(L, 0, sizeof *L);
}

/* The host and device routing info of this rank's slots of layer m in p. */
static ina_status_t slot_info(const ina_expert_placement_t *p, int32_t m, int32_t rank, gpu_slot_layer_t *L) {
  ina_status_t st = INA_OK;
  L->slots = p->slots_per_rank;
  L->info = malloc((size_t)L->slots * 3 * sizeof *L->info + 1);
  INA_CHECK_ALLOC(L->info);
  for (int32_t s = 0; s < L->slots; s++) {
    const int32_t x = ina_expert_placement_slot(p, m, rank, s);
    int32_t count = 0;
    const int32_t j = x >= 0 ? replica_of(p, m, x, rank, s, &count) : 0;
    L->info[3 * s] = x;
    L->info[3 * s + 1] = j;
    L->info[3 * s + 2] = x >= 0 ? count : 1;
  }
  INA_CUDA_CHECK(cudaMalloc((void **)&L->info_dev, (size_t)L->slots * 3 * sizeof *L->info + 4));
  INA_CUDA_CHECK(cudaMemcpy(L->info_dev, L->info, (size_t)L->slots * 3 * sizeof *L->info, cudaMemcpyHostToDevice));
fail:
  return st;
}

/* Grouped-GEMM pointer tables of L's slots (owned by L). */
static ina_status_t slot_tables(gpu_slot_layer_t *L) {
  ina_status_t st = INA_OK;
  const void **w = calloc((size_t)L->slots + 1, sizeof *w);
  const float **sc = calloc((size_t)L->slots + 1, sizeof *sc);
  INA_CHECK_ALLOC(w);
  INA_CHECK_ALLOC(sc);
  L->tables_owned = 1;
  for (int i = 0; i < 3; i++) {
    for (int32_t s = 0; s < L->slots; s++) {
      w[s] = mlp_part(&L->w[s], i)->w;
      sc[s] = mlp_part(&L->w[s], i)->w_scale;
    }
    INA_CUDA_CHECK(cudaMalloc((void **)&L->tab_w[i], ((size_t)L->slots + 1) * sizeof *w));
    INA_CUDA_CHECK(cudaMalloc((void **)&L->tab_s[i], ((size_t)L->slots + 1) * sizeof *sc));
    INA_CUDA_CHECK(cudaMemcpy((void *)L->tab_w[i], w, (size_t)L->slots * sizeof *w, cudaMemcpyHostToDevice));
    INA_CUDA_CHECK(cudaMemcpy((void *)L->tab_s[i], sc, (size_t)L->slots * sizeof *sc, cudaMemcpyHostToDevice));
  }
fail:
  free(w);
  free(sc);
  return st;
}

static ina_status_t ensure_slot_rows(ina_engine_gpu_t *e, int32_t slots) {
  ina_status_t st = INA_OK;
  if (slots <= e->max_slots) return INA_OK;
  gpu_drop_graphs(e); /* they read the old buffers */
  cudaFree(e->slot_begins);
  cudaFree(e->slot_ends);
  e->slot_begins = e->slot_ends = NULL;
  e->max_slots = 0;
  INA_CUDA_CHECK(cudaMalloc((void **)&e->slot_begins, (size_t)slots * sizeof(int32_t)));
  INA_CUDA_CHECK(cudaMalloc((void **)&e->slot_ends, (size_t)slots * sizeof(int32_t)));
  e->max_slots = slots;
fail:
  return st;
}

ina_status_t gpu_placement_init(ina_engine_gpu_t *e) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  if (!e->ep_ranges) return ina_expert_placement_init_contiguous(1, e->num_moe_layers, c->n_routed_experts, &e->placement);
  /* Each rank holds its range, in order, in its first slots. */
  int32_t slots = 1;
  for (int32_t r = 0; r < e->ep_size; r++)
    if (e->ep_ranges[2 * r + 1] - e->ep_ranges[2 * r] > slots) slots = e->ep_ranges[2 * r + 1] - e->ep_ranges[2 * r];
  INA_CHECK(ina_expert_placement_init(e->ep_size, slots, e->num_moe_layers, c->n_routed_experts, &e->placement));
  for (int32_t m = 0; m < e->num_moe_layers; m++)
    for (int32_t r = 0; r < e->ep_size; r++)
      for (int32_t x = e->ep_ranges[2 * r]; x < e->ep_ranges[2 * r + 1]; x++)
        e->placement.slot_expert[ina_expert_placement_index(&e->placement, m, r, x - e->ep_ranges[2 * r])] = x;
  e->slot_layers = calloc((size_t)e->num_moe_layers + 1, sizeof *e->slot_layers);
  INA_CHECK_ALLOC(e->slot_layers);
  const int32_t rank = ina_comm_rank(e->ep_comm);
  for (int32_t l = 0; l < c->num_layers; l++) {
    if (e->moe_index[l] < 0) continue;
    gpu_slot_layer_t *S = &e->slot_layers[e->moe_index[l]];
    const gpu_layer_t *L = &e->w.layers[l];
    INA_CHECK(slot_info(&e->placement, e->moe_index[l], rank, S));
    S->w = calloc((size_t)S->slots + 1, sizeof *S->w);
    S->owned = calloc((size_t)S->slots * PARTS + 1, sizeof *S->owned);
    INA_CHECK_ALLOC(S->w);
    INA_CHECK_ALLOC(S->owned);
    for (int32_t s = 0; s < e->local_experts; s++) {
      S->w[s] = L->experts[s];
      for (int i = 0; i < 3; i++) {
        S->owned[(size_t)s * PARTS + 2 * i] = mlp_part(&S->w[s], i)->w;
        S->owned[(size_t)s * PARTS + 2 * i + 1] = mlp_part(&S->w[s], i)->w_scale;
      }
    }
    /* The slots own the uploaded experts from here on, so that a placement change frees
     * the ones no slot keeps (a buffer the upload did not allocate on its own stays the
     * weights'). */
    INA_CHECK(ina_gpu_weights_disown(&e->w, S->owned, (int64_t)e->local_experts * PARTS));
    for (int i = 0; i < 3; i++) {
      S->tab_w[i] = L->grouped_w[i];
      S->tab_s[i] = L->grouped_scale[i];
    }
  }
  INA_CHECK(ensure_slot_rows(e, slots));
fail:
  return st;
}

void gpu_placement_free(ina_engine_gpu_t *e) {
  for (int32_t m = 0; e->slot_layers && m < e->num_moe_layers; m++) slot_layer_free(&e->slot_layers[m], NULL);
  free(e->slot_layers);
  e->slot_layers = NULL;
  cudaFree(e->slot_begins);
  cudaFree(e->slot_ends);
  ina_expert_placement_free(&e->placement);
}

ina_status_t ina_engine_gpu_get_placement(ina_engine_gpu_t *e, ina_expert_placement_t *out) {
  return ina_expert_placement_copy(&e->placement, out);
}

/* ---- agreement over the ranks -------------------------------------------------------- */

/* Every rank's v over comm into all[size] (device buffers: NCCL). */
static ina_status_t gather_i64(ina_engine_gpu_t *e, ina_comm_t *comm, const int64_t *v, int32_t count, int64_t *all) {
  ina_status_t st = INA_OK;
  int64_t *dev = NULL;
  const int32_t n = ina_comm_size(comm);
  INA_CUDA_CHECK(cudaMalloc((void **)&dev, (size_t)(n + 1) * (size_t)count * sizeof *dev));
  INA_CUDA_CHECK(cudaMemcpyAsync(dev, v, (size_t)count * sizeof *dev, cudaMemcpyHostToDevice, e->stream));
  INA_CHECK(ina_comm_all_gather(comm, dev, dev + count, (size_t)count, INA_DTYPE_I64, e->stream));
  INA_CUDA_CHECK(cudaMemcpyAsync(all, dev + count, (size_t)n * (size_t)count * sizeof *dev, cudaMemcpyDeviceToHost,
                                 e->stream));
  INA_CUDA_CHECK(cudaStreamSynchronize(e->stream));
fail:
  cudaFree(dev);
  return st;
}

/* Sum of v over every rank of the engine (EP group, then TP group). */
static ina_status_t engine_sum(ina_engine_gpu_t *e, int64_t *v) {
  ina_status_t st = INA_OK;
  ina_comm_t *comms[2] = {e->ep_comm, e->tp_comm};
  for (int i = 0; i < 2; i++) {
    if (!comms[i] || ina_comm_size(comms[i]) == 1) continue;
    const int32_t n = ina_comm_size(comms[i]);
    int64_t *all = malloc((size_t)n * sizeof *all);
    INA_CHECK_ALLOC(all);
    st = gather_i64(e, comms[i], v, 1, all);
    *v = 0;
    for (int32_t r = 0; r < n && st == INA_OK; r++) *v += all[r];
    free(all);
    INA_CHECK(st);
  }
fail:
  return st;
}

/* ---- the move ------------------------------------------------------------------------ */

/* The shapes of one routed expert of layer m (any rank that holds one): per part n, k
 * and fp8, and its bytes (weights and scales). */
typedef struct expert_shape {
  int64_t v[9]; /* n, k, fp8 for gate, up, down */
} expert_shape_t;

static int64_t part_bytes(const expert_shape_t *x, int part, int scales) {
  const int64_t n = x->v[3 * part], k = x->v[3 * part + 1], fp8 = x->v[3 * part + 2];
  if (scales) return fp8 ? ina_gemm_w_scale_count(n, k) * (int64_t)sizeof(float) : 0;
  return n * k * (fp8 ? 1 : 2);
}

static int64_t expert_bytes(const expert_shape_t *x) {
  int64_t b = 0;
  for (int i = 0; i < 3; i++) b += part_bytes(x, i, 0) + part_bytes(x, i, 1);
  return b;
}

static ina_status_t layer_shape(ina_engine_gpu_t *e, int32_t m, expert_shape_t *out) {
  ina_status_t st = INA_OK;
  const gpu_slot_layer_t *L = &e->slot_layers[m];
  const int32_t n = ina_comm_size(e->ep_comm);
  int64_t mine[9] = {0}, *all = malloc((size_t)n * 9 * sizeof *all);
  INA_CHECK_ALLOC(all);
  for (int32_t s = 0; s < L->slots && mine[0] == 0; s++)
    for (int i = 0; i < 3 && L->info[3 * s] >= 0; i++) {
      gpu_linear_t *p = mlp_part(&L->w[s], i);
      mine[3 * i] = p->n, mine[3 * i + 1] = p->k, mine[3 * i + 2] = p->fp8;
    }
  INA_CHECK(gather_i64(e, e->ep_comm, mine, 9, all));
  memset(out, 0, sizeof *out);
  for (int32_t r = 0; r < n && out->v[0] == 0; r++) memcpy(out->v, all + 9 * r, sizeof out->v);
fail:
  free(all);
  return st;
}


/* Bytes rank `rank` receives for layer m going from `from` to `to`. */
static int64_t incoming(const ina_expert_placement_t *from, const ina_expert_placement_t *to, int32_t m,
                        int32_t rank, int64_t bytes) {
  int64_t n = 0;
  for (int32_t s = 0; s < to->slots_per_rank; s++) {
    const int32_t x = ina_expert_placement_slot(to, m, rank, s);
    n += x >= 0 && ina_expert_placement_find_slot(from, m, rank, x) < 0;
  }
  return n * bytes;
}

/* One expert a rank receives: new slot `slot` of rank `dest` holds expert x, which rank
 * `source` (the lowest that holds it now) sends. */
typedef struct transfer {
  int32_t dest, slot, expert, source;
} transfer_t;

/* An exchange moves at most this many bytes per rank (the communicators take int32-word
 * counts below INT_MAX / 8 per call); larger moves go in rounds. */
#define ROUND_BYTES ((int64_t)1 << 29)

/* Sends and receives the experts of transfers [t0, t1) (one all-to-all over the EP group,
 * in int32 words: every part's size is a multiple of 4). Receivers fill their new slots. */
static ina_status_t move_round(ina_engine_gpu_t *e, int32_t m, const transfer_t *tr, int32_t t0, int32_t t1,
                               const expert_shape_t *shape, gpu_slot_layer_t *out, int64_t *received,
                               ina_status_t *local) {
  ina_status_t st = INA_OK;
  const ina_expert_placement_t *from = &e->placement;
  const gpu_slot_layer_t *have = &e->slot_layers[m];
  const int32_t n = ina_comm_size(e->ep_comm), me = ina_comm_rank(e->ep_comm);
  const int64_t bytes = expert_bytes(shape);
  size_t *sc = calloc((size_t)n, sizeof *sc), *rc = calloc((size_t)n, sizeof *rc);
  size_t *sd = calloc((size_t)n, sizeof *sd), *rd = calloc((size_t)n, sizeof *rd);
  size_t *cur = calloc((size_t)n, sizeof *cur);
  uint8_t *send = NULL, *recv = NULL;
  int64_t *all = calloc((size_t)n, sizeof *all);
  INA_CHECK_ALLOC(sc);
  INA_CHECK_ALLOC(rc);
  INA_CHECK_ALLOC(sd);
  INA_CHECK_ALLOC(rd);
  INA_CHECK_ALLOC(cur);
  INA_CHECK_ALLOC(all);
  for (int32_t t = t0; t < t1; t++) {
    if (tr[t].source == me) sc[tr[t].dest] += (size_t)bytes;
    if (tr[t].dest == me) rc[tr[t].source] += (size_t)bytes;
  }
  size_t st_total = 0, rt_total = 0;
  for (int32_t r = 0; r < n; r++) {
    sd[r] = st_total, rd[r] = rt_total;
    st_total += sc[r], rt_total += rc[r];
  }
  int64_t no_room = cudaMalloc((void **)&send, st_total + 16) != cudaSuccess ||
                    cudaMalloc((void **)&recv, rt_total + 16) != cudaSuccess;
  if (no_room) (void)cudaGetLastError();
  /* The exchange needs every rank's buffers: the group skips it together. */
  INA_CHECK(gather_i64(e, e->ep_comm, &no_room, 1, all));
  for (int32_t r = 0; r < n; r++) no_room |= all[r];
  if (no_room && *local == INA_OK) {
    ina_error(INA_LOG_SUBSYS, "expert move: MoE layer %d: no device memory for the transfer buffers on some rank", m);
    *local = INA_ERR_OUT_OF_MEMORY;
  }
  /* Pack ours in list order, part by part. */
  memcpy(cur, sd, (size_t)n * sizeof *cur);
  for (int32_t t = t0; t < t1 && *local == INA_OK; t++) {
    if (tr[t].source != me) continue;
    gpu_mlp_t w = have->w[ina_expert_placement_find_slot(from, m, me, tr[t].expert)];
    for (int i = 0; i < 3; i++)
      for (int part = 0; part < 2; part++) {
        const int64_t b = part_bytes(shape, i, part);
        const void *src = part ? (const void *)mlp_part(&w, i)->w_scale : mlp_part(&w, i)->w;
        if (b > 0) INA_CUDA_CHECK(cudaMemcpyAsync(send + cur[tr[t].dest], src, (size_t)b, cudaMemcpyDeviceToDevice, e->stream));
        cur[tr[t].dest] += (size_t)b;
      }
  }
  /* Every rank exchanges, whatever failed locally (the counts are agreed). */
  if (!no_room) {
    for (int32_t r = 0; r < n; r++) sc[r] /= 4, rc[r] /= 4, sd[r] /= 4, rd[r] /= 4;
    INA_CHECK(ina_comm_all_to_all_v(e->ep_comm, send, sc, sd, recv, rc, rd, INA_DTYPE_I32, e->stream));
    for (int32_t r = 0; r < n; r++) rd[r] *= 4;
  }
  INA_CUDA_CHECK(cudaStreamSynchronize(e->stream));
  /* Ours, from each source in the order it packed them, into buffers of their own. */
  memcpy(cur, rd, (size_t)n * sizeof *cur);
  for (int32_t t = t0; t < t1 && *local == INA_OK; t++) {
    if (tr[t].dest != me) continue;
    const int32_t s = tr[t].slot, src = tr[t].source;
    for (int i = 0; i < 3 && *local == INA_OK; i++) {
      gpu_linear_t *p = mlp_part(&out->w[s], i);
      p->n = shape->v[3 * i], p->k = shape->v[3 * i + 1], p->fp8 = (int)shape->v[3 * i + 2];
      for (int part = 0; part < 2; part++) {
        const int64_t b = part_bytes(shape, i, part);
        if (b == 0) continue;
        void *buf = NULL;
        if (cudaMalloc(&buf, (size_t)b) != cudaSuccess) {
          (void)cudaGetLastError();
          ina_error(INA_LOG_SUBSYS, "expert move: MoE layer %d: no device memory for expert %d", m, tr[t].expert);
          *local = INA_ERR_OUT_OF_MEMORY;
          break;
        }
        out->owned[(size_t)s * PARTS + 2 * i + part] = buf;
        INA_CUDA_CHECK(cudaMemcpyAsync(buf, recv + cur[src], (size_t)b, cudaMemcpyDeviceToDevice, e->stream));
        cur[src] += (size_t)b;
        if (part) p->w_scale = buf;
        else p->w = buf;
      }
    }
    *received += bytes;
  }
  INA_CUDA_CHECK(cudaStreamSynchronize(e->stream));
fail:
  cudaFree(send);
  cudaFree(recv);
  free(sc), free(rc), free(sd), free(rd), free(cur), free(all);
  return st;
}

/* Layer m's new slots for this rank into *out: carried as they are, or received in
 * rounds of at most ROUND_BYTES per rank. Collective over the EP communicator; a local
 * failure is kept in *local and the exchanges still run (out is touched only while
 * *local is OK). */
static ina_status_t move_layer(ina_engine_gpu_t *e, int32_t m, const ina_expert_placement_t *to,
                               const expert_shape_t *shape, gpu_slot_layer_t *out, int64_t *received,
                               ina_status_t *local) {
  ina_status_t st = INA_OK;
  const ina_expert_placement_t *from = &e->placement;
  const gpu_slot_layer_t *have = &e->slot_layers[m];
  const int32_t n = to->ep, me = ina_comm_rank(e->ep_comm);
  const int64_t bytes = expert_bytes(shape);
  transfer_t *tr = malloc(((size_t)n * (size_t)to->slots_per_rank + 1) * sizeof *tr);
  int32_t count = 0;
  INA_CHECK_ALLOC(tr);
  for (int32_t d = 0; d < n; d++)
    for (int32_t s = 0; s < to->slots_per_rank; s++) {
      const int32_t x = ina_expert_placement_slot(to, m, d, s);
      if (x >= 0 && ina_expert_placement_find_slot(from, m, d, x) < 0)
        tr[count++] = (transfer_t){d, s, x, ina_expert_placement_source(from, m, x)};
    }
  /* Carried slots: the same tensors, and the same buffers when they are owned. */
  for (int32_t s = 0; s < to->slots_per_rank && *local == INA_OK; s++) {
    const int32_t x = ina_expert_placement_slot(to, m, me, s);
    const int32_t old = x < 0 ? -1 : ina_expert_placement_find_slot(from, m, me, x);
    if (old < 0) continue;
    out->w[s] = have->w[old];
    memcpy(out->owned + (size_t)s * PARTS, have->owned + (size_t)old * PARTS, PARTS * sizeof *out->owned);
  }
  const int32_t per_round = bytes > 0 && bytes < ROUND_BYTES ? (int32_t)(ROUND_BYTES / bytes) : 1;
  for (int32_t t0 = 0; t0 < count; t0 += per_round) {
    const int32_t t1 = t0 + per_round < count ? t0 + per_round : count;
    INA_CHECK(move_round(e, m, tr, t0, t1, shape, out, received, local));
  }
fail:
  free(tr);
  return st;
}

static ina_status_t check_locally(const ina_engine_gpu_t *e, const ina_expert_placement_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p->slot_expert != NULL, INA_ERR_INVALID_ARGUMENT, "expert placement: empty");
  INA_REQUIRE(p->ep == e->placement.ep, INA_ERR_INVALID_ARGUMENT,
              "expert placement: ep is %d, but %d ranks share the experts", p->ep, e->placement.ep);
  INA_REQUIRE(p->num_moe_layers == e->num_moe_layers && p->num_experts == e->cfg->n_routed_experts,
              INA_ERR_INVALID_ARGUMENT, "expert placement: %d MoE layers of %d experts, but the model has %d of %d",
              p->num_moe_layers, p->num_experts, e->num_moe_layers, e->cfg->n_routed_experts);
  INA_CHECK(ina_expert_placement_validate(p));
fail:
  return st;
}

static ina_status_t refused_elsewhere(const char *stage, ina_status_t code) {
  ina_error(INA_LOG_SUBSYS, "expert placement: another rank failed %s (see its log); nothing changed", stage);
  return code;
}

ina_status_t ina_engine_gpu_apply_placement(ina_engine_gpu_t *e, const ina_expert_placement_t *p, int dry_run,
                                            int64_t *bytes_moved) {
  ina_status_t st = INA_OK, local = INA_OK;
  const int32_t L = e->num_moe_layers;
  gpu_slot_layer_t *next = NULL;
  expert_shape_t *shapes = NULL;
  int64_t failures = 0, received = 0;
  *bytes_moved = 0;
  if (!e->ep_comm) {
    INA_REQUIRE(ina_expert_placement_equal(&e->placement, p), INA_ERR_UNSUPPORTED,
                "placement: a CUDA engine without expert parallelism holds every expert once, in order");
    return INA_OK;
  }
  INA_CUDA_CHECK(cudaSetDevice(e->device));
  /* 1. The same valid placement everywhere (digests compared through a sum of
   * differences from rank 0's would not do: gather them). */
  local = check_locally(e, p);
  {
    const int32_t n = ina_comm_size(e->ep_comm);
    int64_t mine = local == INA_OK ? (int64_t)ina_expert_placement_digest(p) : 0, *all = malloc((size_t)n * sizeof *all);
    INA_CHECK_ALLOC(all);
    st = gather_i64(e, e->ep_comm, &mine, 1, all);
    if (st == INA_OK && local == INA_OK && all[0] != mine) {
      ina_error(INA_LOG_SUBSYS, "expert placement: rank %d was given another placement than rank 0",
                ina_comm_rank(e->ep_comm));
      local = INA_ERR_INVALID_ARGUMENT;
    }
    free(all);
    INA_CHECK(st);
  }
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  if (failures) {
    st = local != INA_OK ? local : refused_elsewhere("the placement check", INA_ERR_INVALID_ARGUMENT);
    goto fail;
  }
  /* 2. Device memory for the experts each rank receives (and their staging). */
  shapes = calloc((size_t)L + 1, sizeof *shapes);
  INA_CHECK_ALLOC(shapes);
  {
    int64_t needed = 0, staging = 0, held = 0;
    const int32_t me = ina_comm_rank(e->ep_comm);
    for (int32_t m = 0; m < L; m++) {
      INA_CHECK(layer_shape(e, m, &shapes[m]));
      const int64_t in = incoming(&e->placement, p, m, me, expert_bytes(&shapes[m]));
      needed += in;
      const int64_t round = in < ROUND_BYTES ? in : ROUND_BYTES;
      if (2 * round > staging) staging = 2 * round;
      for (int32_t s = 0; s < p->slots_per_rank; s++)
        if (ina_expert_placement_slot(p, m, me, s) >= 0) held += expert_bytes(&shapes[m]);
    }
    size_t free_bytes = 0, total = 0;
    INA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (e->max_expert_bytes > 0 && held > e->max_expert_bytes) {
      ina_error(INA_LOG_SUBSYS, "expert placement: rank %d would hold %.1f MiB of routed experts, over its limit of "
                "%.1f MiB (max_expert_bytes)", me, (double)held / 1048576.0, (double)e->max_expert_bytes / 1048576.0);
      local = INA_ERR_OUT_OF_MEMORY;
    } else if (needed + staging > (int64_t)free_bytes) {
      ina_error(INA_LOG_SUBSYS, "expert placement: rank %d would receive %.1f MiB of experts, and %.1f MiB of device "
                "memory is free", me, (double)needed / 1048576.0, (double)free_bytes / 1048576.0);
      local = INA_ERR_OUT_OF_MEMORY;
    }
    *bytes_moved = needed;
  }
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  INA_CHECK(engine_sum(e, bytes_moved));
  if (failures) {
    st = local != INA_OK ? local : refused_elsewhere("the memory check", INA_ERR_OUT_OF_MEMORY);
    goto fail;
  }
  if (dry_run) goto fail;
  /* 3. The new slots beside the old ones. */
  next = calloc((size_t)L + 1, sizeof *next);
  INA_CHECK_ALLOC(next);
  {
    const int32_t me = ina_comm_rank(e->ep_comm);
    for (int32_t m = 0; m < L; m++) {
      gpu_slot_layer_t *N = &next[m];
      N->w = calloc((size_t)p->slots_per_rank + 1, sizeof *N->w);
      N->owned = calloc((size_t)p->slots_per_rank * PARTS + 1, sizeof *N->owned);
      if (!N->w || !N->owned) local = INA_ERR_OUT_OF_MEMORY;
      N->slots = p->slots_per_rank;
      /* The exchange runs whatever failed here (move_layer touches N only while local is
       * OK): the other ranks wait for it. */
      INA_CHECK(move_layer(e, m, p, &shapes[m], N, &received, &local));
      if (local == INA_OK) local = slot_info(p, m, me, N);
      const int grouped = e->slot_layers[m].tab_w[0] != NULL;
      if (local == INA_OK && grouped) local = slot_tables(N);
    }
  }
  failures = local != INA_OK;
  INA_CHECK(engine_sum(e, &failures));
  if (failures) {
    st = local != INA_OK ? local : refused_elsewhere("the expert move", INA_ERR_OUT_OF_MEMORY);
    goto fail;
  }
  /* 4. Commit: nothing below can fail but the slot-row buffers' growth. */
  INA_CHECK(ensure_slot_rows(e, p->slots_per_rank));
  gpu_drop_graphs(e); /* they hold the old tables and slot counts */
  for (int32_t m = 0; m < L; m++) {
    gpu_slot_layer_t old = e->slot_layers[m];
    e->slot_layers[m] = next[m];
    slot_layer_free(&old, &e->slot_layers[m]);
    memset(&next[m], 0, sizeof next[m]);
  }
  {
    ina_expert_placement_t copy;
    INA_CHECK(ina_expert_placement_copy(p, &copy));
    ina_expert_placement_free(&e->placement);
    e->placement = copy;
  }
  *bytes_moved = received;
  INA_CHECK(engine_sum(e, bytes_moved));
fail:
  for (int32_t m = 0; next && m < L; m++) slot_layer_free(&next[m], &e->slot_layers[m]);
  free(next);
  free(shapes);
  return st;
}
