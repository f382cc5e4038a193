"""``models.gguf_metadata_string`` (a GGUF header read up to one key) against the ``gguf``
package's own reader, its errors, and ``models.gguf_parsed_once`` (one parse per file while
transformers loads a GGUF model)."""

import pytest

from hfcompress import models

gguf = pytest.importorskip("gguf", reason="needs pip install gguf")


def _write(path, arch="llama"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32("test.count", 7)
    w.add_float32("test.eps", 1e-5)
    w.add_array("test.tokens", ["a", "bc", "", "déjà"])    # strings: skipped one by one
    w.add_array("test.ids", [1, 2, 3])                     # scalars: skipped in one seek
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_bool("test.flag", True)
    w.add_string("test.model", "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return str(path)


def test_reads_strings_past_every_value_type_like_gguf_reader(tmp_path):
    path = _write(tmp_path / "m.gguf")
    fields = gguf.GGUFReader(path).fields
    for key in ("general.architecture", "test.model"):
        expected = bytes(fields[key].parts[fields[key].data[0]]).decode()
        assert models.gguf_metadata_string(path, key) == expected
    assert models.gguf_metadata_string(path, "test.model") == "gpt2"
    assert models.gguf_architecture(path) == "llama"


def test_bad_files_fail_with_the_reason(tmp_path):
    path = _write(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="no 'test.absent'"):
        models.gguf_metadata_string(path, "test.absent")
    with pytest.raises(ValueError, match="not a string"):
        models.gguf_metadata_string(path, "test.count")
    data = open(path, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:data.index(b"gpt2")])                 # ends inside the last value
    with pytest.raises(ValueError, match="truncated"):
        models.gguf_metadata_string(str(cut), "test.model")
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:30])                                 # ends inside the first key
    with pytest.raises(models.ModelLoadError, match="head.gguf.*not a readable GGUF.*truncated"):
        models.gguf_architecture(str(head))
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ValueError, match="version 1 is not supported"):
        models.gguf_metadata_string(str(v1), "general.architecture")


def test_parsed_once_memoizes_within_the_block_and_restores(tmp_path):
    path = _write(tmp_path / "m.gguf")
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with models.gguf_parsed_once():
        a, b = gguf.GGUFReader(path), gguf.GGUFReader(path)
        assert a is b and isinstance(a, reader_cls)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is \
            gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_cls, name_map)
    assert gguf.GGUFReader(path) is not a
