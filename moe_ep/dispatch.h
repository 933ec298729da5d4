/* Expert-parallel dispatch and combine: each rank sends each of its tokens only to the
 * ranks that hold its experts, the ranks run their experts on what they received, and
 * the outputs go back to the tokens' home ranks.
 *
 * The steps of one MoE layer, every rank calling each (they are collective):
 *   1. ina_ep_dispatch: for each (token, chosen expert) the replica table picks a
 *      (rank, slot); each token travels once to every rank that holds one of its experts
 *      (several chosen experts on one rank cost one copy), with the slots it needs there.
 *   2. ina_ep_received: this rank's rows in one of two layouts, each row copied once per
 *      local expert it needs:
 *        CONTIGUOUS  per-slot segments [pairs, hidden], slot s in [first[s], first[s+1])
 *                    (prefill: no padding);
 *        MASKED      a fixed [slots, capacity, hidden] buffer with a count per slot, rows
 *                    past the count undefined (decode: the shapes a CUDA graph replays).
 *      The caller runs slot s's expert on its rows and writes the outputs in the same
 *      layout (ina_ep_outputs gives the buffer).
 *   3. ina_ep_combine: every output row returns to its token's home rank, which sums a
 *      token's rows with the routing weights in ascending expert order, the order the
 *      one-rank engine uses (ina_ep_combine_sum). With payloads that carry the values
 *      exactly (f32, or bf16 for values already bf16), the sum is bit-identical to one
 *      rank holding every expert, since a row's expert output does not depend on where
 *      it was computed.
 *
 * Replica choice: expert x with R replicas sends token t of rank r to replica
 * (t * nranks + r) mod R, the token's interleaved place in the group's batch: local to
 * each rank (no exchange needed) and even over the replicas.
 *
 * Halves: each collective step has a start and a finish (ina_ep_dispatch_start /
 * _finish, ina_ep_combine_start / _finish; ina_ep_dispatch and ina_ep_combine do both).
 * Start sends and returns at once; finish waits for what the peers sent. Between the
 * two the caller computes something else, another micro-batch's attention or experts
 * (two-batch overlap), on a second exchange: every rank starts and finishes the same
 * exchanges in the same order. A failure of one rank's own part (bad routing, no memory)
 * does not leave its peers waiting: its messages carry the failure, and every rank's
 * finish of that step fails. A caller that stops halfway (a step failed) drains the
 * exchanges it has in flight (ina_ep_exchange_drain), so that every rank ends the step
 * with its exchanges idle.
 *
 * Wire (the MPI backend, comm/a2a.h: one message per peer per step, sized by its
 * sender, host buffers): the dispatch message carries a header (the row count, -1 for
 * a failure), per row its K slot entries (int32, -1 where that chosen expert is
 * elsewhere), then the rows' payload; the combine message a header (the output count)
 * and one output row per (row, entry >= 0), in row order then k order.
 * Payloads: F32, BF16, or FP8: each row quantized by ina_fp8_quantize_blocks (core/
 * dtype.h) in 1 x 128 blocks, e4m3 bytes then one f32 scale s = amax / 448 per block,
 * the activations' format of the FP8 grouped GEMM. The FP8 error per element is at most
 * max(2^-4 |x|, 2^-10 s): half an e4m3 ulp of a normal, or of the subnormal spacing
 * 2^-9 s.
 *
 * Backends: the exchange names one (config.backend). MPI is here. NCCL (device buffers,
 * grouped send/recv across nodes) and NVLINK (direct stores into peers' buffers) keep
 * the same calls and layouts, so that an engine written against this header runs on
 * them unchanged; until they exist, create refuses them with INA_ERR_UNSUPPORTED.
 *
 * Ownership: the exchange borrows the communicator and owns its buffers, reused from one
 * layer to the next; the views from ina_ep_received / ina_ep_outputs stay valid until
 * the next dispatch. Thread safety: as the communicator (one thread at a time). */
#ifndef INA_MOE_EP_DISPATCH_H
#define INA_MOE_EP_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_ep_backend {
  INA_EP_BACKEND_MPI = 0,
  INA_EP_BACKEND_NCCL = 1,
  INA_EP_BACKEND_NVLINK = 2,
} ina_ep_backend_t;

typedef enum ina_ep_layout {
  INA_EP_LAYOUT_CONTIGUOUS = 0,
  INA_EP_LAYOUT_MASKED = 1,
} ina_ep_layout_t;

typedef enum ina_ep_payload {
  INA_EP_PAYLOAD_F32 = 0,
  INA_EP_PAYLOAD_BF16 = 1,
  INA_EP_PAYLOAD_FP8 = 2, /* dispatch only: e4m3 rows with 1 x 128 f32 scales */
} ina_ep_payload_t;

/* The FP8 payload's block: one scale per this many columns. */
#define INA_EP_FP8_BLOCK 128

typedef struct ina_ep_config {
  size_t struct_size; /* sizeof(ina_ep_config_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  ina_ep_backend_t backend;
  ina_ep_layout_t layout;
  ina_ep_payload_t dispatch_payload; /* the tokens' rows on their way to the experts */
  ina_ep_payload_t combine_payload;  /* the outputs on their way back (F32 or BF16) */
  int64_t hidden;                    /* row width, >= 1 */
  int32_t top_k;                     /* experts per token, 1..64 */
  int32_t slots_per_rank;            /* expert slots per rank, >= 1 */
  /* MASKED: rows one rank may send to one slot in one layer (its tokens per step, at
   * most); a slot's capacity is this times the ranks. CONTIGUOUS: unused. */
  int64_t max_tokens_per_rank;
} ina_ep_config_t;

#define INA_EP_CONFIG_INIT                                                                  \
  {sizeof(ina_ep_config_t), 1, INA_EP_BACKEND_MPI, INA_EP_LAYOUT_CONTIGUOUS,               \
   INA_EP_PAYLOAD_F32, INA_EP_PAYLOAD_F32, 0, 0, 0, 0}

/* Where each logical expert of one MoE layer lives: the replicas of expert x are entries
 * [first[x], first[x + 1]) of rank[] and slot[] (moe_ep/expert_parallel.h's tables, each
 * pointer advanced to that layer's part). Borrowed for the call. */
typedef struct ina_ep_replicas {
  int32_t num_experts;
  const int32_t *first; /* [num_experts + 1] */
  const int32_t *rank;
  const int32_t *slot;
} ina_ep_replicas_t;

/* What one layer's exchange moved from this rank (bytes as they go on the wire). */
typedef struct ina_ep_stats {
  int64_t rows_sent;      /* (token, destination rank) pairs, this rank included */
  int64_t rows_remote;    /* those to other ranks: they cross the wire */
  int64_t dispatch_bytes; /* payload of the rows to other ranks: rows_remote x row bytes */
  int64_t meta_bytes;     /* their slot entries, rows_remote x top_k x 4, and the 8-byte
                             headers of both steps' messages to the other ranks */
  int64_t combine_bytes;  /* output rows sent back to other ranks */
  int32_t peers_sent;     /* other ranks that got at least one row */
  int64_t wait_ns;        /* time blocked in the layer's two finishes: the exchange time
                             that no compute hid */
} ina_ep_stats_t;

typedef struct ina_ep_exchange ina_ep_exchange_t;

/* Collective over comm (NULL: one rank, everything stays local). Checks the config;
 * INA_ERR_UNSUPPORTED for a backend this build lacks. On failure *out = NULL. */
ina_status_t ina_ep_exchange_create(ina_comm_t *comm, const ina_ep_config_t *config,
                                    ina_ep_exchange_t **out);
void ina_ep_exchange_destroy(ina_ep_exchange_t *ex);

/* Step 1, collective. x [tokens, hidden] f32: this rank's rows (tokens may be 0). ids
 * [tokens, top_k]: logical experts in [0, num_experts), or < 0 for an entry nobody
 * computes. A replica table that does not match the exchange (a slot outside
 * slots_per_rank, a rank outside the group, an expert without replica) is
 * INA_ERR_INVALID_ARGUMENT on the calling rank and INA_ERR_INTERNAL ("rank r failed")
 * on the others, all at the finish; a NULL exchange or buffer, or a start while the
 * previous layer is in flight, fails the start at once (a caller's bug). x and ids are
 * read by the start only. */
ina_status_t ina_ep_dispatch_start(ina_ep_exchange_t *ex, const ina_ep_replicas_t *replicas,
                                   const float *x, const int32_t *ids, int64_t tokens);
ina_status_t ina_ep_dispatch_finish(ina_ep_exchange_t *ex);
ina_status_t ina_ep_dispatch(ina_ep_exchange_t *ex, const ina_ep_replicas_t *replicas,
                             const float *x, const int32_t *ids, int64_t tokens);

/* Step 2: the rows this rank received, decoded to f32, in the exchange's layout. */
typedef struct ina_ep_received {
  ina_ep_layout_t layout;
  int32_t slots;
  const float *rows;      /* CONTIGUOUS [first[slots], hidden]; MASKED [slots, capacity, hidden] */
  const int64_t *first;   /* CONTIGUOUS: [slots + 1] segment starts; MASKED: NULL */
  const int64_t *count;   /* [slots]: rows of each slot */
  int64_t capacity;       /* MASKED: rows per slot in the buffer; CONTIGUOUS: 0 */
  int64_t hidden;         /* row width */
} ina_ep_received_t;

void ina_ep_received(const ina_ep_exchange_t *ex, ina_ep_received_t *out);
/* The buffer for the experts' outputs, laid out as the received rows (f32). */
float *ina_ep_outputs(ina_ep_exchange_t *ex);

/* Step 3, collective. The start, after the outputs are written, sends them home; the
 * finish writes out [tokens, hidden] f32 (the tokens and ids of the dispatch) =
 * ina_ep_combine_sum of the expert outputs: for each token the weights[t, k] times its
 * expert outputs in ascending expert order; entries with ids < 0 add nothing. *stats
 * (may be NULL) receives the layer's traffic. */
ina_status_t ina_ep_combine_start(ina_ep_exchange_t *ex);
ina_status_t ina_ep_combine_finish(ina_ep_exchange_t *ex, const float *weights, float *out,
                                   ina_ep_stats_t *stats);
ina_status_t ina_ep_combine(ina_ep_exchange_t *ex, const float *weights, float *out,
                            ina_ep_stats_t *stats);

/* Finishes whatever step is in flight, discarding it: after a failed step every rank
 * drains its exchanges, so that the next step starts with all of them idle. Returns the
 * wire's status (a broken communicator), INA_OK when nothing was in flight. */
ina_status_t ina_ep_exchange_drain(ina_ep_exchange_t *ex);

/* The one-rank combine, the definition the exchange reproduces: y [tokens, top_k,
 * hidden] holds each entry's expert output; out [tokens, hidden] = for each token, 0 plus
 * weights[t, k] * y[t, k] added in ascending order of ids[t, k] (entries < 0 skipped). */
void ina_ep_combine_sum(const int32_t *ids, const float *weights, const float *y, int64_t tokens,
                        int32_t top_k, int64_t hidden, float *out);

const char *ina_ep_backend_name(ina_ep_backend_t backend);
const char *ina_ep_layout_name(ina_ep_layout_t layout);

#ifdef __cplusplus
}
#endif

#endif
