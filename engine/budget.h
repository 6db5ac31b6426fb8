/*
 * engine/budget.h — the start-up arithmetic eng_create runs on a config,
 * exposed as pure functions so that tools can size a deployment and tests
 * can check the figures against their own: the GPU memory budget and what
 * one rank holds, the KV block's bytes, the one-shot all-reduce plan.
 */
#ifndef ECHO_ENGINE_BUDGET_H
#define ECHO_ENGINE_BUDGET_H

#include <stddef.h>

#include "engine/engine.h"
#include "model/model.h"

/* --gpu-memory-utilization's KV budget per rank, in bytes: of util x total
 * (one GPU's memory), what is left after the memory already in use when
 * echo starts (total - free: other processes, the CUDA context) and, for
 * each of the ranks_per_gpu ranks on it, its weights and activations,
 * shared by those ranks. 0 when nothing is left (or util is out of (0, 1]). */
size_t eng_gpu_kv_budget(double util, size_t total, size_t free_bytes, size_t weights, size_t activations,
                         int ranks_per_gpu);
/* What one rank holds on a GPU for model mc under c (bf16 weights: its
 * share of every matrix, the embedding whole) and an estimate of its
 * activations and workspace at max_batch_tokens (fp32, conservative). */
size_t eng_gpu_weight_bytes(const eng_config *c, const model_config *mc);
size_t eng_gpu_activation_bytes(const eng_config *c, const model_config *mc);
/* Bytes of KV one block of a rank holds (all layers, keys and values) for
 * this config (kv_dtype resolved by device: fp32 on a host backend, bf16
 * on a GPU) and model: the unit of kv_cache_memory. */
size_t eng_kv_block_bytes(const eng_config *c, const model_config *mc);

/* eng_config.oneshot resolved: the threshold in bytes (0: off) for ranks
 * as processes or threads, on host memory or not. */
size_t eng_oneshot_plan(long oneshot, int tp, int procs, int host_memory);

#endif
