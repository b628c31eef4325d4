"""On-call pages over the seeded database: copy-as-issue Markdown, the regressions page, the overview's link."""

from __future__ import annotations

import html
import re


def test_triage_offers_the_issue_as_markdown(app_client, seeded) -> None:
    page = app_client.get(f"/runs/{seeded.regressed}/triage").text
    match = re.search(r'<textarea id="issue-md"[^>]*>(.*?)</textarea>', page, re.S)
    assert match, "no copy-as-issue block"
    md = html.unescape(match.group(1))
    assert md.startswith("## Resume parity fail (regression on main): moe-fp32-router dp=2 steps=20 save_step=10")
    assert f"[#{seeded.regressed}](http://testserver/runs/{seeded.regressed})" in md
    assert f"[#{seeded.good}](http://testserver/runs/{seeded.good}) on environment" in md
    assert "`optimizer-index-misalignment`" in md and "(https://github.com/NVIDIA/Megatron-LM/" in md
    assert "Megatron-Core `0.16.1`" in md and "- Verdict: fail (regression on main) — " in md
    assert "| package | `megatron-core` | 0.16.0 | 0.16.1 |" in md  # what changed since the last good run
    assert "parity run-local --environment default --config moe-fp32-router" in md and "parity submit" in md
    assert 'data-copy="issue-md"' in page


def test_overview_links_open_regressions_and_shows_tracks(app_client, seeded) -> None:
    page = app_client.get("/").text
    assert 'href="/regressions" id="open-regressions-link">Open regressions: 0' in page
    matrix = page[page.index('id="matrix"'):]
    assert "<th>main</th>" in matrix and "mcore 0.16.1" in matrix  # tracks as columns, the build in the cell
    listing = app_client.get("/regressions")
    assert listing.status_code == 200 and "No open regressions" in listing.text
    assert app_client.get("/regressions/999").status_code == 404
