/* The work split of the MoE permutation that its workspace size depends on, shared by
 * the kernels (moe_permute.cu) and the size function, which every build has
 * (moe_permute_workspace.c). Internal header. */
#ifndef INA_MOE_EP_MOE_PERMUTE_LAYOUT_H
#define INA_MOE_EP_MOE_PERMUTE_LAYOUT_H

/* Entries counted and placed by one CTA; the workspace holds one int32 per
 * (chunk, expert). */
#define INA_GPU_MOE_PERMUTE_CHUNK_ENTRIES 2048
#define INA_GPU_MOE_PERMUTE_MAX_EXPERTS 1024
#define INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN 256

#endif
