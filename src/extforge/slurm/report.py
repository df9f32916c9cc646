"""Per-variant state as rows for people (a table on stderr) and machines (--json)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..ui import console
from .state import VariantStatus
from .submit import diagnose, read_log, split_job_log, tail

STYLE = {"published": "green", "built": "yellow", "pending": "cyan", "running": "cyan", "failed": "red", "lost": "red"}


def status_rows(statuses: list[VariantStatus]) -> list[dict]:
    """One dict per variant; failed ones carry their log tail and explain's diagnosis."""
    rows = []
    for s in statuses:
        row: dict[str, Any] = {"variant": s.variant_id, "state": s.state, "job_id": s.job_id, "detail": s.detail, "log": s.log}
        if s.state in {"failed", "lost"}:
            text = read_log(s.log)
            build_output, error = split_job_log(text)
            row["log_tail"] = tail(build_output)
            row["error"] = error
            row["diagnosis"] = diagnose(text)
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    table = Table(show_edge=False, pad_edge=False)
    for col in ("variant", "state", "job", "detail"):
        table.add_column(col)
    for r in rows:
        style = STYLE.get(r["state"], "")
        table.add_row(r["variant"], f"[{style}]{r['state']}[/{style}]" if style else r["state"], r["job_id"] or "-", r["detail"])
    console.print(table)
    for r in rows:
        if "log_tail" not in r:
            continue
        console.print(f"\n[red]✗ {r['variant']}[/red] (job {r['job_id']}, log {r['log']}):", highlight=False)
        console.print(r["log_tail"] or "(log is empty)", markup=False)
        if r["error"]:
            console.print(r["error"], markup=False)
        diagnosis = r["diagnosis"] or {}
        for d in diagnosis.get("diagnoses", []):
            console.print(f"[bold]diagnosis {d['id']}:[/bold] {d['title']}")
            console.print(f"  cause: {d['cause']}\n  fix:   {d['fix']}", markup=False)
        if diagnosis and not diagnosis.get("recognised"):
            console.print(f"diagnosis: {diagnosis.get('advice', 'unknown')}", markup=False)
