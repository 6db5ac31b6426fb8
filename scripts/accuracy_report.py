#!/usr/bin/env python3
"""docs/accuracy.md (and the plot's data) from echo-eval --json runs at tp 1
and tp 3 (scripts/accuracy.sh)."""
import json
import sys


def bits(g):
    return 4 + 16 / g  # 4-bit codes + one bf16 scale per group


def main():
    tp1, tp3 = (json.load(open(p)) for p in sys.argv[1:3])
    md_path, dat_path = sys.argv[3], sys.argv[4]
    ex1, ex3 = tp1["exact"], tp3["exact"]
    rows = tp3["modes"]
    L = []
    L.append("# Echo's accuracy on a trained model\n")
    L.append("SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, the Q4_1 GGUF that "
             "`make serve` serves, dequantized to fp32), teacher-forced on held-out English text: the "
             "Python 3.11 tutorial's reST sources from Debian's `python3.11-doc`, reduced to plain "
             f"paragraphs (`scripts/rst2text.py`): {tp3['prompts']} prompts of 128 tokens, "
             f"{tp3['tokens_scored']} next-token predictions scored per row. Greedy agreement: "
             f"{tp3['gen_tokens']} greedy tokens from each prompt, compared with exact at the same tp.\n")
    L.append("Reproduce: `scripts/accuracy.sh` (about 20 minutes on 2 cores; `--quick` for a smoke run). "
             "Wire cost counts the 4-bit codes and one bf16 scale per group. `min_B`: the size policy "
             "(messages below it take the exact path; 262144 keeps decode batches of up to 113 tokens "
             "exact here and quantizes the 128-token prefills).\n")
    L.append("| tp | all-reduce | G | min_B | bits/value | perplexity | next-token acc | Δ vs exact | "
             "top-1 = exact | mean KL | greedy agree (of %d) | all %d agree |" % (tp3["gen_tokens"], tp3["gen_tokens"]))
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    L.append(f"| 1 | exact | – | – | 32 | {ex1['ppl']:.3f} | {100*ex1['next_token_acc']:.2f} % | – | – | – | – | – |")
    L.append(f"| 3 | exact | – | – | 32 | {ex3['ppl']:.3f} | {100*ex3['next_token_acc']:.2f} % | "
             f"{100*(ex3['next_token_acc']-ex1['next_token_acc']):+.2f} pt (vs tp 1) | – | – | – | – |")
    for r in rows:
        L.append(f"| 3 | {r['mode']} | {r['group']} | {r['min_bytes']} | {bits(r['group']):.3f} | {r['ppl']:.3f} | "
                 f"{100*r['next_token_acc']:.2f} % | {r['next_token_acc_delta_pt']:+.2f} pt | "
                 f"{100*r['top1_agreement']:.1f} % | {r['kl_mean']:.3f} | {r['greedy_agree_len_mean']:.1f} | "
                 f"{100*r['greedy_full_agree_frac']:.0f} % |")
    L.append("")
    echo = [r for r in rows if r["mode"] == "echo"]
    int4 = [r for r in rows if r["mode"] == "int4"]
    ok_echo = [r for r in echo if r["next_token_acc_delta_pt"] >= -0.4]
    ok_int4 = [r for r in int4 if r["next_token_acc_delta_pt"] >= -0.4]
    best_echo = max(echo, key=lambda r: r["next_token_acc_delta_pt"]) if echo else None
    best_int4 = max(int4, key=lambda r: r["next_token_acc_delta_pt"]) if int4 else None
    L.append("## Verdict\n")
    if best_echo:
        L.append(f"- **Echo within 0.4 points of exact: {'yes' if ok_echo else 'no'}.** Its best row "
                 f"(G = {best_echo['group']}, min_B = {best_echo['min_bytes']}) loses "
                 f"{-best_echo['next_token_acc_delta_pt']:.2f} points of next-token accuracy at "
                 f"{bits(best_echo['group']):.2f} bits/value; the paper reports ≤ 0.4 points on Qwen3-8B.")
    if best_int4:
        L.append(f"- int4 (the same codec without error feedback) within 0.4 points: "
                 f"{'yes' if ok_int4 else 'no'}; its best row loses {-best_int4['next_token_acc_delta_pt']:.2f} points.")
    nopol = [r for r in echo if r["min_bytes"] == 0]
    if nopol:
        g = max(nopol, key=lambda r: (r["next_token_acc_delta_pt"], r["group"]))["group"]
        L.append(f"- Default group size chosen from this table: **G = {g}** (echo's smallest accuracy loss "
                 f"among G ∈ {{32, 64, 128}}; {bits(g):.2f} bits/value on the wire, so Echo's wire cost stays "
                 "≤ 4.5 bits/value).")
    L.append("- Why so far from the paper: trained models carry outlier channels in exactly the "
             "activations tensor parallelism all-reduces; with absmax scaling one outlier sets its group's "
             "scale and flattens the rest of the group to zero. A 135M model at tp 3 also has 60 "
             "all-reduces per pass over a small hidden size. Codecs that handle outliers (rotations, "
             "finer scales, outlier channels in 16 bits) are the subject of the next step.\n")
    L.append("![next-token accuracy change vs exact](accuracy.png)\n")
    with open(md_path, "w") as f:
        f.write("\n".join(L) + "\n")
    # plot data: G, int4, echo, int4 with policy, echo with policy
    groups = sorted({r["group"] for r in rows})
    with open(dat_path, "w") as f:
        for g in groups:
            def d(mode, mb):
                v = [r["next_token_acc_delta_pt"] for r in rows if r["mode"] == mode and r["group"] == g
                     and (r["min_bytes"] == 0) == (mb == 0)]
                return f"{v[0]:.4f}" if v else "NaN"
            f.write(f"{g} {d('int4', 0)} {d('echo', 0)} {d('int4', 1)} {d('echo', 1)}\n")


if __name__ == "__main__":
    main()
