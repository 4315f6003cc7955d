"""The benchmark's ``--head LABEL=FOLDER`` option: the drafting method comes from the folder's config.json."""

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_speculative  # noqa: E402

SHIPPED = ROOT / "specjax" / "shipped" / "smollm2-135m-instruct"


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft"])
def test_head_option_reads_the_kind_from_the_shipped_folders(kind):
    assert bench_speculative.head_option(f"new={SHIPPED / kind}") == ("new", (kind, str(SHIPPED / kind)))


def test_head_option_refuses_a_folder_of_no_known_kind(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(argparse.ArgumentTypeError, match="not a Medusa head, an EAGLE-3 head"):
        bench_speculative.head_option(f"x={tmp_path}")
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL=FOLDER"):
        bench_speculative.head_option(str(tmp_path))
