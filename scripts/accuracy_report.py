#!/usr/bin/env python3
"""docs/accuracy.md (and the Pareto plot's data) from echo-eval --json runs at
tp 1 and tp 3 and echo-bench codec --json throughput (scripts/accuracy.sh).

    accuracy_report.py TP1.json TP3.json OUT.md PLOT.dat [CODEC.json [QWEN3.json]]
                       [--extra TP3.json]... [--more TP3.json]...

--extra: more rows of the same run setup (same prompts: its exact must match);
--more: the same codecs on further held-out text (other prompts), pooled with
the main run's rows per codec into one estimate with its standard error.

The default preset is read from comm/echo.h (ECHO_DEFAULT_CODEC) and the
codec table in comm/preset.c (its default G).

Rows of older echo-eval builds (no "codec" key) are the int4 codec."""
import json
import os
import re
import sys

BOUND = -0.4  # the paper's: within 0.4 points of exact
BUDGET = 4.5  # wire bits/value the issue allows



def norm(j):
    """echo-eval before issue 30 named the codec without feedback `int4`
    (its JSON rows have no "feedback" key); today that is `echo-nofb`, and
    `int4` is the paper's codec preset."""
    for r in j.get("modes", []):
        if r.get("mode") == "int4" and "feedback" not in r:
            r["mode"] = "echo-nofb"
    return j

def codec_bits(codec, g):
    # the codec table's (comm/preset.c): 4-bit codes + one bf16 scale per group
    return 4 + 16 / g


def row_bits(r):
    return r.get("bits_per_value") or codec_bits(r.get("codec", "int4"), r["group"])


def load_many(path):
    """Concatenated JSON arrays (one echo-bench run per codec)."""
    out, text, dec, i = [], open(path).read(), json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.extend(obj if isinstance(obj, list) else [obj])


def name(r):
    return f"{r.get('codec', 'int4')}-g{r['group']}"


def default_preset():
    """(codec name, G) of `--allreduce echo`, from the sources."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        h = open(os.path.join(root, "comm/echo.h")).read()
        c = open(os.path.join(root, "comm/preset.c")).read()
        cid = re.search(r"#define ECHO_DEFAULT_CODEC (ECHO_CODEC_\w+)", h).group(1)
        # {name, rotate, code_bits, scale_bytes, sub_bits, min_group, default_group, form}
        m = re.search(r"\[" + cid + r"\] = \{([^}]*)\}", c)
        f = [x.strip() for x in m.group(1).split(",")]
        m_name, g = f[0].strip('"'), f[6]
        if not g.isdigit():
            g = re.search(r"#define " + g + r" (\d+)", h).group(1)
        return m_name, int(g)
    except (OSError, AttributeError):
        return None


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--more", action="append", default=[])
    args = ap.parse_args()
    sys.argv = [sys.argv[0]] + args.files
    tp1, tp3 = (norm(json.load(open(p))) for p in sys.argv[1:3])
    for e in args.extra:
        ex = norm(json.load(open(e)))
        if abs(ex["exact"]["next_token_acc"] - tp3["exact"]["next_token_acc"]) > 1e-9:
            raise SystemExit(f"{e}: its exact run differs from the main one (other prompts?)")
        tp3["modes"] = tp3["modes"] + ex["modes"]
    more = [norm(json.load(open(m))) for m in args.more]
    md_path, dat_path = sys.argv[3], sys.argv[4]
    speed = {}
    if len(sys.argv) > 5:
        for b in load_many(sys.argv[5]):
            speed[f"{b.get('codec', 'int4')}-g{b['group']}"] = b
    ex1, ex3 = tp1["exact"], tp3["exact"]
    rows = sorted(tp3["modes"], key=lambda r: (r["mode"] != "echo", row_bits(r), r.get("codec", "int4")))
    L = []
    L.append("# Echo's accuracy on a trained model\n")
    L.append("SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, the Q4_1 GGUF that "
             "`make serve` serves, dequantized to fp32), teacher-forced on held-out English text: the "
             "Python 3.11 tutorial's reST sources from Debian's `python3.11-doc`, reduced to plain "
             f"paragraphs (`scripts/rst2text.py`): {tp3['prompts']} prompts of 128 tokens, "
             f"{tp3['tokens_scored']} next-token predictions scored per row. Greedy agreement: "
             f"{tp3['gen_tokens']} greedy tokens from each prompt, compared with exact at the same tp.\n")
    L.append("Reproduce: `scripts/accuracy.sh` (about an hour on 2 shared cores; `--quick` for a smoke "
             "run; `--codecs LIST` for other codecs). Each row is one codec of the codec table "
             "(`comm/echo.h`) at group size G, without (`echo-nofb`) or with (`echo`) error feedback. "
             "bits/value is the wire cost from the table (codes + scales). ± is the standard error of "
             "the paired accuracy difference (tokens that only one of the two gets right), so "
             "differences below about twice it are noise.\n")
    L.append("Codecs (docs/echo.md §2b): `int4` is the paper's (int4 codes in [−7, 7], one bf16 scale per "
             "G values); `hadamard` first rotates each group by H·D (Walsh–Hadamard, fixed random signs, "
             "`comm/codec/echo_codec.h`), so that an outlier channel is spread over its group instead of "
             "setting a scale that flattens the rest of the group to zero; ranks add rotated values "
             "and rotate the sum back once. `hsub6` rotates every 16 values and gives each 16 its own "
             "6-bit scale under the group's bf16 one. `out2` carries the two largest values of each "
             "group in bf16 (with their indices) and codes the rest under the third largest; `hout2` "
             "does that and then rotates the rest of the group.\n")
    gt = tp3["gen_tokens"]
    L.append(f"| tp | all-reduce | codec | G | bits/value | perplexity | next-token acc | Δ vs exact | "
             f"top-1 = exact | mean KL | greedy agree (of {gt}) | all {gt} agree |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    L.append(f"| 1 | exact | – | – | 32 | {ex1['ppl']:.3f} | {100*ex1['next_token_acc']:.2f} % | – | – | – | – | – |")
    L.append(f"| 3 | exact | – | – | 32 | {ex3['ppl']:.3f} | {100*ex3['next_token_acc']:.2f} % | "
             f"{100*(ex3['next_token_acc']-ex1['next_token_acc']):+.2f} pt (vs tp 1) | – | – | – | – |")
    for r in rows:
        se = r.get("next_token_acc_delta_se_pt")
        pm = f" ± {se:.2f}" if se is not None else ""
        mb = f" (min_B {r['min_bytes']})" if r.get("min_bytes") else ""
        L.append(f"| 3 | {r['mode']}{mb} | {r.get('codec', 'int4')} | {r['group']} | {row_bits(r):.3f} | "
                 f"{r['ppl']:.3f} | {100*r['next_token_acc']:.2f} % | {r['next_token_acc_delta_pt']:+.2f}{pm} pt | "
                 f"{100*r['top1_agreement']:.1f} % | {r['kl_mean']:.3f} | {r['greedy_agree_len_mean']:.1f} | "
                 f"{100*r['greedy_full_agree_frac']:.0f} % |")
    L.append("")
    if speed:
        L.append("Codec throughput on this CPU (`echo-bench codec --codec NAME-gG --count 1M`: one thread, "
                 "encode with error feedback and decode-accumulate of 1M fp32 values, best of 5, on a "
                 "shared 2-core machine, so rough):\n")
        L.append("| codec | G | bits/value | encode GB/s | decode+acc GB/s | rel err, Gaussian | rel err, outliers |")
        L.append("|---|---|---|---|---|---|---|")
        for k, b in sorted(speed.items(), key=lambda kv: (kv[1].get("codec", "int4"), kv[1]["group"])):
            L.append(f"| {b.get('codec', 'int4')} | {b['group']} | {b['wire_bits_per_value']:.3f} | "
                     f"{b['encode_gbps']:.2f} | {b['decode_acc_gbps']:.2f} | {b['rel_err_gauss']:.4f} | "
                     f"{b['rel_err_outlier']:.4f} |")
        L.append("")
    if len(sys.argv) > 6 and os.path.getsize(sys.argv[6]) > 0:
        q = norm(json.load(open(sys.argv[6])))
        L.append(f"Qwen3 fixture (`{q['model']}`: random weights, {q['layers']} layers, so only the KL to "
                 f"exact means anything), tp {q['tp']}, {q['prompts']} random prompts: mean KL of the "
                 "next-token distribution to exact, lower is better — the new codecs must not regress on a "
                 "model without trained outliers:\n")
        L.append("| codec | G | bits/value | KL, echo-nofb | KL, echo |")
        L.append("|---|---|---|---|---|")
        keys = sorted({name(r) for r in q["modes"]}, key=lambda k: k)
        for k in keys:
            rs = {r["mode"]: r for r in q["modes"] if name(r) == k}
            any_r = next(iter(rs.values()))
            kl = lambda m: f"{rs[m]['kl_mean']:.3f}" if m in rs else "–"
            L.append(f"| {any_r.get('codec', 'int4')} | {any_r['group']} | {row_bits(any_r):.3f} | {kl('echo-nofb')} | "
                     f"{kl('echo')} |")
        L.append("")
    pooled = {}
    if more:
        # per (mode, codec): the main run's row plus the same row on each further chunk
        for r in rows:
            if r.get("min_bytes"):
                continue
            key = (r["mode"], name(r))
            parts = [(r, tp3["tokens_scored"])]
            for m in more:
                parts += [(q, m["tokens_scored"]) for q in m["modes"] if (q["mode"], name(q)) == key]
            if len(parts) < 2 or any("next_token_acc_delta_se_pt" not in q for q, _ in parts):
                continue
            n = sum(w for _, w in parts)
            d = sum(q["next_token_acc_delta_pt"] * w for q, w in parts) / n
            se = sum((q["next_token_acc_delta_se_pt"] * w) ** 2 for q, w in parts) ** 0.5 / n
            kl = sum(q["kl_mean"] * w for q, w in parts) / n
            pooled[key] = (d, se, n, len(parts), [q["next_token_acc_delta_pt"] for q, _ in parts], kl)
        chunks = len({round(m["exact"]["next_token_acc"], 9) for m in more})
        L.append(f"Pooled over more held-out text: the rows above (text 1) plus the same all-reduce on "
                 f"{chunks} further disjoint chunks of the tutorial text (`--more`; 50 prompts of 128 tokens "
                 "each, scored against exact on the same chunk), weighted by tokens:\n")
        L.append("| all-reduce | codec | G | bits/value | Δ per chunk (pt) | pooled Δ vs exact | tokens | mean KL |")
        L.append("|---|---|---|---|---|---|---|---|")
        for (mode, k), (d, se, n, c, ds, kl) in sorted(pooled.items(), key=lambda kv: kv[1][0], reverse=True):
            r = next(r for r in rows if (r["mode"], name(r)) == (mode, k))
            L.append(f"| {mode} | {r.get('codec', 'int4')} | {r['group']} | {row_bits(r):.3f} | "
                     f"{', '.join(f'{x:+.2f}' for x in ds)} | **{d:+.2f} ± {se:.2f}** | {n} | {kl:.3f} |")
        L.append("")
    echo = [r for r in rows if r["mode"] == "echo" and not r.get("min_bytes")]
    int4 = [r for r in rows if r["mode"] == "echo-nofb" and not r.get("min_bytes")]
    L.append("## Verdict\n")

    def eff(r):
        """(delta, se, where): pooled over all text when measured there, else this run's row."""
        key = (r["mode"], name(r))
        if key in pooled:
            d, se, n, c, _, _ = pooled[key]
            return d, se, f"pooled over {c} chunks, {n} tokens"
        return r["next_token_acc_delta_pt"], r.get("next_token_acc_delta_se_pt"), f"{tp3['tokens_scored']} tokens"

    def fmt(r):
        d, se, where = eff(r)
        return f"{d:+.2f}" + (f" ± {se:.2f}" if se is not None else "") + f" points ({where})"

    ok = sorted([r for r in echo if eff(r)[0] >= BOUND and row_bits(r) <= BUDGET + 1e-9], key=row_bits)
    in_budget = [r for r in echo if row_bits(r) <= BUDGET + 1e-9]
    best = max(in_budget, key=lambda r: eff(r)[0]) if in_budget else None
    if ok:
        r = ok[0]
        L.append(f"- **Within 0.4 points of exact at ≤ {BUDGET} bits/value: yes.** The cheapest such row is "
                 f"echo with `{name(r)}` ({row_bits(r):.3f} bits/value): {fmt(r)}.")
    elif best:
        d = eff(best)[0]
        L.append(f"- **Within 0.4 points of exact at ≤ {BUDGET} bits/value: no.** The best is echo with "
                 f"`{name(best)}` ({row_bits(best):.3f} bits/value): {fmt(best)}, {BOUND - d:+.2f} points "
                 "from the bound.")
    dp = default_preset()
    if dp:
        d = [r for r in echo if r.get("codec", "int4") == dp[0] and r["group"] == dp[1]]
        if d:
            r = d[0]
            L.append(f"- **Default preset** (`--allreduce echo`, `ECHO_DEFAULT_CODEC` in comm/echo.h): "
                     f"`{dp[0]}-g{dp[1]}` with error feedback, {row_bits(r):.3f} bits/value: {fmt(r)}; "
                     f"{'within' if eff(r)[0] >= BOUND else 'outside'} 0.4 points of exact.")
    if int4:
        bi = max(int4, key=lambda r: eff(r)[0])
        L.append(f"- Without error feedback (mode int4) the best row is `{name(bi)}`: {fmt(bi)}. Error "
                 "feedback is worth the difference between the int4 and echo rows of the same codec.")
    L.append("- Why the plain codec loses so much here: trained models carry outlier channels in exactly "
             "the activations tensor parallelism all-reduces; with absmax scaling one outlier sets its "
             "group's scale and flattens the rest of the group to zero. Rotating each group spreads "
             "the outlier, smaller groups or finer scales confine it, carrying it in 16 bits removes it. "
             "A 135M model at tp 3 also has 60 all-reduces per pass over a small hidden size, so every "
             "call's error reaches the logits. On one chunk of 6350 tokens the paired standard error is "
             "about 0.25 points, as large as the differences between the 4.5-bit codecs: rank them by "
             "the pooled rows and the KL, not by one chunk.\n")
    L.append("![next-token accuracy change vs wire bits/value](accuracy.png)\n")
    with open(md_path, "w") as f:
        f.write("\n".join(L) + "\n")
    # Pareto plot data: bits (nudged apart when several codecs share them), delta, se,
    # series (0 int4, 1 echo), label
    at = {}
    for r in rows:
        at.setdefault(round(row_bits(r), 4), set()).add(name(r))
    with open(dat_path, "w") as f:
        for r in rows:
            if r.get("min_bytes"):
                continue
            b = round(row_bits(r), 4)
            names = sorted(at[b])
            x = b + 0.03 * (names.index(name(r)) - (len(names) - 1) / 2)
            f.write(f"{x:.4f} {r['next_token_acc_delta_pt']:.4f} "
                    f"{r.get('next_token_acc_delta_se_pt', 0):.4f} {1 if r['mode'] == 'echo' else 0} "
                    f"{name(r)}\n")


if __name__ == "__main__":
    main()
