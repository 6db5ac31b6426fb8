#!/usr/bin/env python3
"""Write a GGUF file's copy with every quantized tensor dequantized to F32.

    scripts/gguf-dequantize.py IN.gguf OUT.gguf

The metadata is copied as it is (general.file_type becomes ALL_F32), the
tensors keep their names, shapes and order; F32/F16/BF16 tensors are
copied, block-quantized ones become F32 through the gguf package's
dequantize (ggml's values). For llama-quantize: quantizing this copy to
another type starts from the values the quantized file holds, instead of
requantizing blocks (scripts/bench-vs-llamacpp.sh, the SmolLM2 formats).
Needs the gguf and numpy packages (build/venv-clients has them).
"""
import sys

import gguf
import numpy as np

KEEP = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    src, dst = argv[1], argv[2]
    reader = gguf.GGUFReader(src)
    arch_field = reader.fields.get(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        sys.exit(f"{src}: no {gguf.Keys.General.ARCHITECTURE}")
    arch = arch_field.contents()
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    datas = []
    for i, t in enumerate(reader.tensors):
        if t.tensor_type in KEEP:
            data, qtype = t.data, t.tensor_type
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            qtype = gguf.GGMLQuantizationType.F32
        datas.append(data)
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, qtype)
        if (i + 1) % 50 == 0 or i + 1 == len(reader.tensors):
            print(f"gguf-dequantize: {i + 1}/{len(reader.tensors)} tensors ({t.name}: {t.tensor_type.name} -> "
                  f"{qtype.name})", file=sys.stderr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in datas:
        writer.write_tensor_data(data)
    writer.close()


if __name__ == "__main__":
    main(sys.argv)
