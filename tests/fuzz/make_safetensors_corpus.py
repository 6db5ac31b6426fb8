#!/usr/bin/env python3
"""Write the seed corpus for tests/fuzz/fuzz_safetensors.c.

Each seed is one whole safetensors file image: valid files with a few tensors
and one file per kind of corruption the reader must reject. Stdlib only; run
from anywhere:  python3 tests/fuzz/make_safetensors_corpus.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def image(header, data=b"", hlen=None, pad=True):
    """8-byte little-endian header length + header + data. `header` is a
    dict (serialised compactly, padded with spaces to 8 bytes like the
    reference writer) or raw bytes; `hlen` overrides the length field."""
    if isinstance(header, (dict, list)):
        h = json.dumps(header, separators=(",", ":")).encode()
        if pad:
            h += b" " * (-len(h) % 8)
    else:
        h = header
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def raw_entries(*pairs):
    """Header text with possibly repeated keys (json.dumps cannot)."""
    body = ",".join('"%s":%s' % (k, json.dumps(v, separators=(",", ":"))) for k, v in pairs)
    return ("{" + body + "}").encode()


def seeds():
    data = bytes(range(64))
    yield "valid_mixed", image({
        "__metadata__": {"format": "pt"},
        "model.layers.0.self_attn.q_proj.weight": t("BF16", [2, 3], 0, 12),
        "model.norm.weight": t("F16", [4], 12, 20),
        "lm_head.weight": t("F32", [2, 2], 20, 36),
        "scalar": t("F32", [], 36, 40),
        "empty": t("F32", [0, 5], 40, 40),
    }, data[:40])
    yield "valid_all_dtypes", image({
        "f64": t("F64", [1], 0, 8), "i64": t("I64", [1], 8, 16), "i32": t("I32", [1], 16, 20),
        "i16": t("I16", [1], 20, 22), "i8": t("I8", [1], 22, 23), "u8": t("U8", [1], 23, 24),
        "bool": t("BOOL", [1], 24, 25), "e4m3": t("F8_E4M3", [1], 25, 26),
        "e5m2": t("F8_E5M2", [1], 26, 27), "u16": t("U16", [1], 28, 30),
        "u32": t("U32", [1], 32, 36), "u64": t("U64", [1], 40, 48),
    }, data[:48])
    yield "valid_empty_header", image({}, pad=False)
    yield "valid_unsorted_gaps", image({
        "b": t("U8", [2, 2], 10, 14), "a": t("BF16", [1, 1, 2], 0, 4), "e": t("I8", [0], 5, 5),
    }, data[:16])
    yield "bad_truncated", b"\x10\x00\x00\x00"
    yield "bad_header_len_beyond_file", image({}, hlen=4096)
    yield "bad_header_len_huge", image({}, hlen=2**64 - 1)
    yield "bad_malformed_json", image(b'{"a":{"dtype":"F32","shape":[1],')
    yield "bad_header_not_object", image([1, 2, 3])
    yield "bad_entry_not_object", image({"a": [0, 4]}, data[:4])
    yield "bad_missing_dtype", image({"a": {"shape": [1], "data_offsets": [0, 4]}}, data[:4])
    yield "bad_shape_wrong_type", image({"a": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}, data[:4])
    yield "bad_offsets_wrong_type", image({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, data[:8])
    yield "bad_negative_dim", image({"a": t("F32", [-1, 2], 0, 0)})
    yield "bad_shape_overflow", image({"a": t("U8", [2**32, 2**32], 0, 0)})
    yield "bad_too_many_dims", image({"a": t("U8", [1] * 9, 0, 1)}, data[:1])
    yield "bad_unknown_dtype", image({"a": t("F12", [1], 0, 4)}, data[:4])
    yield "bad_offsets_outside", image({"a": t("F32", [4], 0, 16)}, data[:8])
    yield "bad_begin_after_end", image({"a": t("F32", [1], 8, 4)}, data[:8])
    yield "bad_overlap", image({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, data[:12])
    yield "bad_size_mismatch", image({"a": t("F32", [2, 2], 0, 12)}, data[:16])
    yield "bad_duplicate", image(raw_entries(
        ("model.layers.0.mlp.up_proj.weight", t("U8", [1], 0, 1)),
        ("model.layers.0.mlp.up_proj.weight", t("U8", [1], 1, 2))), data[:2])
    yield "bad_metadata_not_object", image({"__metadata__": ["pt"], "a": t("U8", [1], 0, 1)}, data[:1])


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, blob in seeds():
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
