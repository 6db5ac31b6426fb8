#!/usr/bin/env python3
"""Checks on echo-bench randmodel folders and echo-bench forward --json, stdlib only.

  check_forward.py randmodel DIR SHAPE LAYERS   config.json has SHAPE's published Qwen3 fields (layers
                                                overridden to LAYERS); model.safetensors has every tensor
                                                the loader needs, BF16, 8-byte-aligned offsets without
                                                gaps, data filling the file; linears ~N(0, 0.02), norms 1
  check_forward.py forward FILE                 every number in the JSON is finite and every rate > 0

Exit 0 = pass; otherwise the reason is printed.
"""
import json
import math
import struct
import sys

SHAPES = {  # Qwen/Qwen3-8B and Qwen/Qwen3-0.6B config.json; tiny is echo's CI shape
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1000000,
                     rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=40960),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
}


def fail(msg):
    print("check_forward.py:", msg)
    sys.exit(1)


def bf16_values(raw, limit):
    n = min(len(raw) // 2, limit)
    return [struct.unpack("<f", struct.pack("<I", u << 16))[0] for u in struct.unpack(f"<{n}H", raw[: 2 * n])]


def check_randmodel(d, shape, layers):
    cfg = json.load(open(f"{d}/config.json"))
    want = dict(SHAPES[shape], num_hidden_layers=layers)
    for k, v in want.items():
        if cfg.get(k) != v:
            fail(f"config.json {k} = {cfg.get(k)!r}, expected {v!r}")
    if cfg.get("architectures") != ["Qwen3ForCausalLM"] or cfg.get("model_type") != "qwen3":
        fail("config.json is not a Qwen3ForCausalLM config")
    json.load(open(f"{d}/generation_config.json"))
    H, I, V, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    qd, kvd = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    need = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not cfg["tie_word_embeddings"]:
        need["lm_head.weight"] = [V, H]
    for l in range(layers):
        p = f"model.layers.{l}."
        need.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                     p + "self_attn.q_proj.weight": [qd, H], p + "self_attn.k_proj.weight": [kvd, H],
                     p + "self_attn.v_proj.weight": [kvd, H], p + "self_attn.o_proj.weight": [H, qd],
                     p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                     p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                     p + "mlp.down_proj.weight": [H, I]})
    with open(f"{d}/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        if (8 + n) % 8:
            fail(f"data area starts at {8 + n}, not 8-byte aligned")
        f.seek(0, 2)
        size = f.tell()
        names = [k for k in hdr if k != "__metadata__"]
        if sorted(names) != sorted(need):
            fail(f"tensors differ: extra {sorted(set(names) - set(need))[:3]}, missing {sorted(set(need) - set(names))[:3]}")
        end = 0
        for k in sorted(names, key=lambda k: hdr[k]["data_offsets"][0]):
            t = hdr[k]
            b, e = t["data_offsets"]
            if t["dtype"] != "BF16" or t["shape"] != need[k]:
                fail(f"{k}: {t['dtype']} {t['shape']}, expected BF16 {need[k]}")
            if b % 8 or b < end or b - end >= 8 or e - b != 2 * math.prod(t["shape"]):
                fail(f"{k}: data_offsets {t['data_offsets']} (previous end {end})")
            end = e
            f.seek(8 + n + b)
            v = bf16_values(f.read(min(e - b, 1 << 16)), 1 << 15)
            mean = sum(v) / len(v)
            std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
            if "norm" in k:
                if any(x != 1.0 for x in v):
                    fail(f"{k}: norm weights are not 1")
            elif not (abs(mean) < 0.005 and 0.015 < std < 0.025):
                fail(f"{k}: mean {mean:.4g}, std {std:.4g}: not ~N(0, 0.02)")
        if size < 8 + n + end or size - (8 + n + end) >= 8:
            fail(f"file is {size} bytes, data ends at {8 + n + end}")
    print(f"check_forward.py: {len(names)} tensors, {size} bytes, config matches {shape} with {layers} layers")


def check_forward(path):
    d = json.load(open(path))

    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
        elif isinstance(x, float) and not math.isfinite(x):
            fail(f"{where} = {x}")

    walk(d, "")
    if not d["prefill"] or not d["decode"]:
        fail("no prefill or decode rows")
    for r in d["prefill"]:
        for k in ("ms", "tokens_per_s", "tflop", "tflops"):
            if not r[k] > 0:
                fail(f"prefill {r['tokens']}: {k} = {r[k]}")
        if abs(r["tokens_per_s"] - r["tokens"] / (r["ms"] / 1e3)) > 1e-3 * r["tokens_per_s"]:
            fail(f"prefill {r['tokens']}: tokens_per_s disagrees with ms")
    for r in d["decode"]:
        for k in ("ms_per_step", "tokens_per_s", "roofline_tokens_per_s", "roofline_pct", "bytes_per_step"):
            if not r[k] > 0:
                fail(f"decode batch {r['batch']}: {k} = {r[k]}")
        if abs(r["tokens_per_s"] - r["batch"] / (r["ms_per_step"] / 1e3)) > 1e-3 * r["tokens_per_s"]:
            fail(f"decode batch {r['batch']}: tokens_per_s disagrees with ms_per_step")
    # the roofline's bandwidth: a streaming read on cpu, ops->copy on a device
    bw = "read_gbps" if d["device"] == "cpu" else "copy_gbps"
    if bw not in d:
        fail(f"no {bw} on device {d['device']}")
    for k in (bw, "weight_bytes", "weight_bytes_read_per_step", "kv_bytes_per_token"):
        if not d[k] > 0:
            fail(f"{k} = {d[k]}")
    if "ttft" in d and not d["ttft"]["ms"] > 0:
        fail(f"ttft ms = {d['ttft']['ms']}")
    if d["logits_finite"] is not True:
        fail("non-finite logits")
    print(f"check_forward.py: {len(d['prefill'])} prefill and {len(d['decode'])} decode rows, all positive")


def main():
    if sys.argv[1] == "randmodel":
        check_randmodel(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "forward":
        check_forward(sys.argv[2])
    else:
        fail(f"unknown check {sys.argv[1]}")


if __name__ == "__main__":
    main()
