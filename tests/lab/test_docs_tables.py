"""The docs' tables of counted figures are renderings of the commands' recorded output (``scripts/docs_tables.py``).

(a) every generated block in the pages equals the rendering of its records; (b) the cheap records are counted again
and equal their records (HART-0.7B's baseline FLOPs and memory); (c) one sub-figure of a big-model record is counted again (the first
scale of the Infinity-2B baseline). Counting a whole Infinity generation on meta tensors takes minutes on a loaded
2-core CPU (the time goes to Python dispatch of about 46,000 meta ops through ``FlopCounterMode``), so the full 2B and
8B counts are checked by ``python scripts/docs_tables.py record`` and ``check``, not here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs_tables():
    return load_script("docs_tables")


def recorded(docs_tables):
    return sorted(p.stem for p in docs_tables.COUNTS.glob("*.json"))


def test_every_generated_block_is_the_rendering_of_its_records(docs_tables):
    placed = [
        (page, m["name"])
        for page in docs_tables.PAGES
        if (ROOT / page).exists()
        for m in docs_tables.blocks((ROOT / page).read_text())
    ]
    assert len(placed) >= 3, placed  # the pages hold generated tables
    assert all(name in docs_tables.TABLES for _, name in placed), placed
    assert docs_tables.stale_blocks() == []


def test_a_changed_figure_or_an_unknown_block_is_named(docs_tables, tmp_path, monkeypatch):
    page = next(p for p in docs_tables.PAGES if (ROOT / p).exists() and docs_tables.blocks((ROOT / p).read_text()))
    text = (ROOT / page).read_text()
    match = docs_tables.blocks(text)[0]
    body = match["body"]
    digit = next(i for i, c in enumerate(body) if c.isdigit() and body[i - 1] == ".")
    changed = body[:digit] + str((int(body[digit]) + 1) % 10) + body[digit + 1 :]  # one figure's decimal moved
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / page).write_text(text[: match.start("body")] + changed + text[match.end("body") :])
    shutil.copytree(docs_tables.COUNTS, tmp_path / "docs" / "counts", dirs_exist_ok=True)
    monkeypatch.setattr(docs_tables, "ROOT", tmp_path)
    monkeypatch.setattr(docs_tables, "PAGES", (page,))
    assert docs_tables.stale_blocks() == [f"{page}: {match['name']}"]
    assert docs_tables.main(["write"]) == 0 and docs_tables.stale_blocks() == []
    assert (tmp_path / page).read_text() == text
    (tmp_path / page).write_text(text + "\n<!-- generated: no_such_table -->\nx\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="unknown generated block 'no_such_table'"):
        docs_tables.render_page((tmp_path / page).read_text(), page)


def test_records_name_their_command_and_agree_on_each_baseline(docs_tables):
    """Every record holds the command that printed it; its rows are the methods that command names; and every record
    of one model and CFG setting (comparisons, full reports, conventions' real count) has the same baseline total."""
    from diffusers_var_accel.schedulers.specs import split_acceleration_specs

    names = recorded(docs_tables)
    assert names and set(names) <= set(docs_tables.RECORDS), names
    baselines, kinds = {}, set()
    for name in (n for n in names if docs_tables.RECORDS[n][0] == "flops"):
        record = docs_tables.load_record(name)
        args = docs_tables.RECORDS[name]
        assert record["command"] == "var-accel " + " ".join(args)
        assert isinstance(record["package_version"], str) and record["package_version"]
        output = record["output"]
        methods = split_acceleration_specs(args[args.index("--accel") + 1]) if "--accel" in args else []
        if "--conventions" in args:
            kinds.add("conventions")
            real = next(r for r in output["conventions"] if r["convention"].startswith("real count:"))
            assert list(real["totals"]) == ["baseline", *methods]
            total = real["totals"]["baseline"]
        elif methods:
            kinds.add("comparison")
            assert [row["method"] for row in output["summary"]] == ["baseline", *methods]
            total = output["summary"][0]["total_tflops"]
        else:
            kinds.add("report")
            assert output["accel"] == "baseline" and output["cfg"] == ("--no-cfg" not in args)
            total = output["total_tflops"]
        baselines.setdefault((output["model"], output["cfg"]), set()).add(total)
    assert kinds == {"comparison", "report", "conventions"}, kinds
    assert all(len(totals) == 1 for totals in baselines.values()), baselines


def test_a_corrupted_record_fails_naming_the_file(docs_tables, tmp_path, monkeypatch):
    monkeypatch.setattr(docs_tables, "COUNTS", tmp_path)
    (tmp_path / "broken.json").write_text('{"command": "var-accel flops"')
    with pytest.raises(ValueError, match="broken.json: not a readable count record"):
        docs_tables.load_record("broken")
    (tmp_path / "partial.json").write_text(json.dumps({"command": "var-accel flops"}))
    with pytest.raises(ValueError, match=r"partial.json: a count record needs \['package_version', 'output'\]"):
        docs_tables.load_record("partial")


def test_the_rounding_rule():
    module = load_script("docs_tables", "docs_tables_rule")
    # the command's float to two decimals: ARVAR's 70.7649... is 70.76, not the 70.77 a sum of rounded parts gave
    assert module.num(70.76491) == "70.76" and module.num(125.051853078528) == "125.05"
    assert module.times(1.7672, "x") == "1.77x"


def test_hart_baseline_recounts_to_its_record(docs_tables):
    """(b) The cheap count: HART-0.7B's baseline, counted again on meta tensors, equals the record bit for bit."""
    from diffusers_var_accel.lab.bench.hart_flops import count_hart_flops

    record = docs_tables.load_record("flops_hart_0.7b")["output"]
    assert count_hart_flops()["total_tflops"] == record["summary"][0]["total_tflops"]


def test_infinity_2b_first_scale_recounts_to_its_record(docs_tables):
    """(c) A cheap sub-figure of a big record: the transformer FLOPs of the Infinity-2B baseline's first scale (1x1),
    counted on a one-scale schedule (a scale's count depends only on the scales before it), equal the record's."""
    from diffusers_var_accel.lab.bench import infinity_flops as inf

    name = next(n for n in recorded(docs_tables) if n.startswith("flops_infinity_2b"))
    per_scale = docs_tables.load_record(name)["output"]["per_scale"]
    schedule, template = inf.schedule_for_size(1024, 1024)
    spec = inf.MODEL_SPECS["infinity-2b"]
    run = inf.infinity_generation(
        inf.build_on_meta(inf.InfinityTransformer, **spec.transformer),
        inf.build_on_meta(inf.InfinityBSQVAE, **spec.vae),
        schedule[:1],
        inf.rope_grid_hw(template),
        cfg=True,
        batch_size=1,
        text_tokens=inf.DEFAULT_TEXT_TOKENS,
        spatial_patchify=spec.spatial_patchify,
        scheduler=None,
    )
    counted = inf.add_tflops(inf.meter_generation(inf.INFINITY_FLOPS, run), inf.INFINITY_FLOPS, None)
    assert counted["per_scale"][0]["tflops"] == per_scale[0]["baseline"]
    assert per_scale[0]["h"] == per_scale[0]["w"] == 1


def test_memory_records_hold_the_rows_their_command_asks_for(docs_tables):
    """Each ``var-accel memory`` record holds the rows of the flags its command names: every documented recipe of the
    model without recipe flags, else the one setting the flags spell (what ``main`` builds from them)."""
    from diffusers_var_accel.lab.bench import memory

    assert set(docs_tables.MEMORY_RECORDS) <= set(recorded(docs_tables))
    for name, args in docs_tables.MEMORY_RECORDS.items():
        record = docs_tables.load_record(name)
        assert record["command"] == "var-accel " + " ".join(args)
        assert args[:1] == ["memory"] and args[-2:] == ["--json", docs_tables.MEMORY_FILE], args
        flags = memory.build_parser().parse_args(args[1:-2])
        if all(getattr(flags, f) is None for f in memory._RECIPE_FLAGS):
            expected = [s.label() for s in memory.RECIPES[flags.model]]
        else:
            setting = memory.MemorySettings(
                flags.model,
                accel=flags.accel,
                dtype=flags.dtype or "bfloat16",
                weights=flags.weights or "none",
                offload=flags.offload or "none",
                streams=bool(flags.streams),
                tiling=bool(flags.tiling),
                kv=flags.kv or "none",
            )
            expected = [setting.label()]
        rows = record["output"]["rows"]
        assert [r["label"] for r in rows] == expected, name
        assert {(r["model"], r["batch_size"], r["height"], r["cfg"]) for r in rows} == {
            (flags.model, flags.batch_size, 1024, True)
        }, name


def test_hart_baseline_memory_recounts_to_its_record(docs_tables):
    """(b) The cheap memory count: HART-0.7B's bf16 baseline at 1024x1024 (the first row of its recipes record),
    counted again on meta tensors, equals the record byte for byte in every phase and part."""
    from diffusers_var_accel.lab.bench.memory import MemorySettings, count_memory

    row = docs_tables.load_record("memory_hart_0.7b_recipes")["output"]["rows"][0]
    assert row["label"] == "baseline, bfloat16" and row["batch_size"] == 1
    assert json.loads(json.dumps(count_memory(MemorySettings("hart-0.7b")))) == row


def test_the_frontier_table_reads_its_runs_and_names_a_broken_one(docs_tables, tmp_path, monkeypatch):
    """The calibration frontier block renders every row of the strict run once, each calibrated row described from
    its settings; a corrupted run file fails naming it."""
    table = docs_tables.TABLES["calibration_frontier"]()
    strict = docs_tables.frontier_rows("strict")
    body = table.splitlines()[2:]
    assert len(body) == len(strict)
    for row in strict:
        if row.get("method"):
            assert docs_tables.describe_setting(row["method"], row["settings"]) in table
    for name in docs_tables.FRONTIER_FILES.values():
        shutil.copy(docs_tables.FRONTIER / name, tmp_path / name)
    monkeypatch.setattr(docs_tables, "FRONTIER", tmp_path)
    assert docs_tables.TABLES["calibration_frontier"]() == table
    (tmp_path / docs_tables.FRONTIER_FILES["strict"]).write_text('[{"name": "baseline"')
    with pytest.raises(ValueError, match="embedded_frontier_heldout_strict.json: not a readable frontier record"):
        docs_tables.TABLES["calibration_frontier"]()


def test_a_block_inside_a_list_item_keeps_its_indent(docs_tables):
    text = "1. A point:\n\n   <!-- generated: flops_infinity_2b_savings -->\n   | stale |\n   <!-- end generated -->\n"
    rendered = docs_tables.render_page(text, "page.md")
    body = docs_tables.blocks(rendered)[0]["body"]
    assert body.splitlines() and all(line.startswith("   | ") for line in body.splitlines())
    assert body == docs_tables._indented(docs_tables.TABLES["flops_infinity_2b_savings"](), "   ") + "\n"
    assert docs_tables.render_page(rendered, "page.md") == rendered
