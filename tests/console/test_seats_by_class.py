"""The queues page's seats by class and the offline gate's seat-bound reason, through
Django's test client over real rows and the real Redis (REDIS_URL): each class's target or
fixed bound, its measured p99, the seats the classes below hold of what they may hold, what
each class may hold now and what holds it back; and the note when no bound is set."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from capacity.units import GIB
from fairqueue import EnginePolicy
from fairqueue.queue import LastWords
from scheduler.models import Engine
from scheduler.pools.policies import fair_queue
from scheduler.selectors import engine_gate

pytestmark = pytest.mark.django_db

SEATS = 4
NONE = "\u2013"  # the dash a cell shows for nothing


def policy(**bounds: object) -> EnginePolicy:
    return EnginePolicy(
        "llama-a", "llama", kv_budget_bytes=8 * GIB, max_num_seqs=SEATS, load=0.1,
        **bounds,  # type: ignore[arg-type]
    )  # fmt: skip


def run(request_class: str) -> str:
    """A job of the class picked on llama-a; returns its id."""
    queue = fair_queue()
    queue.enqueue(tenant="acme", pool="llama", request_class=request_class, prompt_tokens=10,
                  max_tokens=10, kv_bytes=GIB // 4)  # fmt: skip
    job = queue.pick("llama", "llama-a")
    assert job is not None
    assert job.request_class == request_class
    return job.job_id


def missed_target() -> None:
    """An interactive job whose first token came in 1.2 s, four times its 300 ms target: the
    controller cuts the seats below interactive to 1 (lua/lib.lua observe_ttft)."""
    job_id = run("interactive")
    assert fair_queue().release("llama", job_id, 10, 10, last_words=LastWords(ttft_s=1.2))


def section(html: str) -> str:
    found = re.search(r'<section class="card" id="seats">.*?</section>', html, re.S)
    assert found is not None
    return found.group(0)


def class_row(html: str, request_class: str) -> dict[str, str]:
    """The cells of a class's row in the llama-a table, as text."""
    table = re.search(r'<table class="table compact seats" data-engine="llama-a">.*?</table>',
                      html, re.S)  # fmt: skip
    assert table is not None
    row = re.search(rf'<tr data-class="{request_class}">(.*?)</tr>', table.group(0), re.S)
    assert row is not None
    cells = re.findall(r'<td(?: class="([^"]*)")?>(.*?)</td>', row.group(1), re.S)
    text = {name.replace("num ", ""): re.sub(r"<[^>]+>", "", cell).strip() for name, cell in cells}
    text["_html"] = row.group(1)
    return text


def gate_row(html: str) -> str:
    row = re.search(r'<tr data-engine="llama-a">.*?</tr>', html, re.S)
    assert row is not None
    return unescape(row.group(0))


def test_a_missed_target_shows_its_p99_its_full_bound_and_what_it_holds_back(
    console: Client, engine: Engine
):
    queue = fair_queue()
    queue.set_engine_policy(
        policy(ttft_targets_s={"interactive": 0.3}, fixed_seats_below={"standard": 2})
    )
    missed_target()
    run("offline")  # one seat below interactive: its bound of 1 is full

    html = section(console.get("/console/queues/").content.decode())

    interactive = class_row(html, "interactive")
    assert interactive["setting"] == "target 300 ms"
    assert interactive["p99"] == "1200 ms (1 measured)"
    assert 'class="badge warn">1200 ms' in interactive["_html"]  # over its target
    assert interactive["below"] == "1 / 1 full"
    assert 'class="meter-inline over"' in interactive["_html"]
    assert (interactive["held"], interactive["may-hold"], interactive["limit"]) == ("0", "4", NONE)
    standard = class_row(html, "standard")
    assert standard["setting"] == "fixed 2 seats below"
    assert standard["p99"] == NONE  # a fixed bound measures nothing
    assert standard["below"] == "1 / 2"
    assert "meter-inline over" not in standard["_html"]
    assert standard["may-hold"] == "0"  # interactive's bound leaves it none
    assert unescape(standard["limit"]).startswith("interactive's TTFT target")
    offline = class_row(html, "offline")
    assert (offline["held"], offline["may-hold"], offline["setting"]) == ("1", "1", NONE)
    assert unescape(offline["limit"]).startswith("interactive's TTFT target")
    assert "No seat bounds are set" not in html
    # The gate names the target that holds offline back, though the load would let it in.
    gate = gate_row(console.get("/console/queues/").content.decode())
    assert "closed" in gate
    assert "interactive's TTFT target of 300 ms holds offline back" in gate
    assert "hold 1 of the 1 seat it lets them hold now" in gate


def test_a_bound_with_room_holds_nothing_back(console: Client, engine: Engine):
    fair_queue().set_engine_policy(policy(fixed_seats_below={"interactive": 3}))
    run("standard")

    page = console.get("/console/queues/").content.decode()
    html = section(page)

    interactive = class_row(html, "interactive")
    assert interactive["setting"] == "fixed 3 seats below"
    assert interactive["below"] == "1 / 3"
    assert 'style="width:33%"' in interactive["_html"]  # the bar: 1 of 3 held
    assert class_row(html, "standard")["may-hold"] == "3"
    assert class_row(html, "offline")["may-hold"] == "2"  # 3, less the standard seat
    assert all(class_row(html, c)["limit"] == NONE for c in ("standard", "offline"))
    assert "open" in gate_row(page)


def test_the_pool_line_says_where_its_bounds_come_from(console: Client, engine: Engine, settings):
    settings.GPUSHARE_TTFT_TARGETS_MS = {"interactive": 300}
    fair_queue().set_engine_policy(policy(ttft_targets_s={"interactive": 0.3}))

    html = section(console.get("/console/live/queues/").content.decode())

    assert "Pool <code>llama</code>: TTFT p99 targets interactive 300 ms (settings)" in html
    interactive = class_row(html, "interactive")
    assert interactive["p99"] == "not measured yet"
    assert interactive["below"].startswith("no bound now")  # no controller until measured


def test_without_a_bound_the_section_says_how_to_set_one(console: Client, engine: Engine):
    fair_queue().set_engine_policy(policy())
    run("offline")

    page = console.get("/console/queues/").content.decode()
    html = section(page)

    assert "No seat bounds are set" in html
    assert "GPUSHARE_TTFT_TARGETS_MS" in html
    assert "manage.py pool targets POOL --ttft-ms interactive=300" in html
    assert "<table" not in html
    assert "open" in gate_row(page)


def test_the_gates_own_reasons_come_before_a_seat_bound(engine: Engine):
    queue = fair_queue()
    queue.set_engine_policy(policy(fixed_seats_below={"interactive": 1}))
    run("standard")  # the one seat interactive's fixed bound leaves the classes below

    gate = engine_gate(queue=queue, engine=engine)
    assert (gate.is_open, gate.shut_by, gate.held_back_by) == (False, "bound", "interactive")
    assert gate.why.startswith("interactive's fixed bound of 1 seat holds offline back")

    queue.set_engine_load("llama", "llama-a", 0.9)
    gate = engine_gate(queue=queue, engine=engine)
    assert (gate.shut_by, gate.held_back_by) == ("load", "")
    assert gate.why.startswith("load 90%, at or over 40%")


def test_a_target_no_longer_measured_holds_nothing_back(engine: Engine):
    queue = fair_queue()
    queue.set_engine_policy(policy(ttft_targets_s={"interactive": 0.3}))
    missed_target()
    run("offline")
    seconds, micros = queue.redis.time()
    now = seconds + micros / 1e6

    assert engine_gate(queue=queue, engine=engine, now=now).shut_by == "bound"
    # Unmeasured for longer than its idle time (30 s by default), the bound lapses.
    assert engine_gate(queue=queue, engine=engine, now=now + 31).shut_by == ""


def test_a_mistake_in_the_settings_is_shown_not_a_server_error(
    console: Client, engine: Engine, settings
):
    settings.GPUSHARE_TTFT_TARGETS_MS = {"offline": 300}  # offline has no class below it
    fair_queue().set_engine_policy(policy(fixed_seats_below={"interactive": 3}))

    response = console.get("/console/queues/")

    assert response.status_code == 200
    html = unescape(section(response.content.decode()))
    assert "GPUSHARE_TTFT_TARGETS_MS: 'offline' has no classes below it to bound" in html
