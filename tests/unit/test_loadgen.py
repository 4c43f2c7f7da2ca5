"""jobs/loadgen.py: curves (CSV and built-in), seeded Poisson arrivals, and a replay against a real local
HTTP server on 127.0.0.1 (aiohttp, in this process's thread; no Ray)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> Any:
    name = "rgo_example_loadgen"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "jobs" / "loadgen.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


lg = _load()


# ---- curves ---------------------------------------------------------------------------------------
def test_the_shipped_curves_parse() -> None:
    for p in sorted((REPO / "jobs" / "curves").glob("*.csv")):
        c = lg.read_csv(p)
        assert c.duration_s > 0 and c.peak > 0, p
    day = lg.read_csv(REPO / "jobs" / "curves" / "diurnal.csv")
    assert day.duration_s == 86_400 and day.rate(46_800) == 30 and day.rate(43_200) == pytest.approx(26.667, abs=0.01)


@pytest.mark.parametrize("text, field", [
    ("secs,rps\n0,1\n", "line 1: header"),
    ("seconds,requests_per_s\n", "rows"),
    ("seconds,requests_per_s\n0,1\n5,x\n", "line 3: requests_per_s"),
    ("seconds,requests_per_s\n0,1\n5,-2\n", "line 3: requests_per_s"),
    ("seconds,requests_per_s\n0,1\n5,2\n5,3\n", "line 4: seconds"),
    ("seconds,requests_per_s\n# a comment\n1,1\n", "line 3: seconds"),
    ("seconds,requests_per_s\n0,1,2\n", "line 2"),
])
def test_a_bad_csv_is_a_typed_error_naming_the_line_and_field(tmp_path: Path, text: str, field: str) -> None:
    p = tmp_path / "c.csv"
    p.write_text(text)
    with pytest.raises(lg.CurveError) as e:
        lg.read_csv(p)
    assert e.value.field == f"c.csv {field}" or e.value.field == f"c.csv: {field}", e.value.field


def test_built_in_curves_and_their_errors() -> None:
    s = lg.parse_curve("spike:base=2,peak=20,at=10,for=5,duration=30")
    assert (s.rate(5), s.rate(11), s.rate(14), s.rate(25)) == (2, 20, 20, 2) and s.rate(10.5) == pytest.approx(11)
    assert lg.parse_curve("steady:rps=7,duration=3").rate(1.5) == 7
    d = lg.parse_curve("diurnal:low=1,high=9")
    assert d.rate(14 * 3600) == pytest.approx(9) and d.rate(2 * 3600) == pytest.approx(1)
    for spec, field in (("spike:base=2,peak=20,at=10,duration=30", "spike.for"), ("steady:rps=fast,duration=3", "steady.rps"),
                        ("spike:base=2,peak=20,at=10,for=30,duration=30", "spike"), ("square:rps=1", "curve")):
        with pytest.raises(lg.CurveError) as e:
            lg.parse_curve(spec)
        assert e.value.field == field, spec

def test_arrivals_are_seeded_poisson_following_the_curve_and_compressed() -> None:
    c = lg.parse_curve("spike:base=20,peak=200,at=20,for=20,duration=60,ramp=0.001")
    a = lg.arrivals(c, seed=1)
    assert a == lg.arrivals(c, seed=1) and a != lg.arrivals(c, seed=2)
    assert a == sorted(a) and all(0 <= t < 60 for t in a)
    base = sum(1 for t in a if t < 20) / 20
    peak = sum(1 for t in a if 20.1 < t < 40) / 19.9
    assert 15 < base < 25 and 180 < peak < 220, (base, peak)
    assert abs(len(a) - c.expected_requests()) < 4 * c.expected_requests() ** 0.5
    # compressed 10x: the same rates per wall second over a tenth of the time
    b = lg.arrivals(c, compress=10, seed=1)
    assert max(b) < 6 and abs(len(b) - c.expected_requests(10)) < 4 * c.expected_requests(10) ** 0.5


def test_summary_percentiles_and_slo_attainment_count_failures_as_misses() -> None:
    recs = [lg.Record(i * 0.1, 0.010 * (i + 1), 200) for i in range(98)] + [
        lg.Record(10, 0.001, 503), lg.Record(11, 0.001, "ClientConnectorError")]
    s = lg.summarize(recs, slo_ms=500)
    assert s["sent"] == 100 and s["ok"] == 98 and s["errors"] == 2
    # linear between the two closest ranks (core/stats, every figure's percentile): 98 answers 10..980 ms
    assert s["p50_ms"] == 495.0 and s["p99_ms"] == pytest.approx(970.3)
    assert s["slo_attainment_pct"] == 50.0  # 50 of 100 answered 200 within 500 ms


# ---- a replay against a real server ----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    """An aiohttp server on 127.0.0.1: answers after ``state['delay_s']``, 500 when the body is not 32 numbers."""
    from aiohttp import web

    state: dict[str, Any] = {"delay_s": 0.0, "bodies": 0}
    port = _free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        state["bodies"] += 1
        await asyncio.sleep(state["delay_s"])
        if len(body["inputs"][0]) != lg.INPUT_WIDTH:
            return web.Response(status=500)
        return web.json_response({"outputs": [0.0]})

    async def main() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    def body() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(main())
        state["runner"] = runner
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    t = threading.Thread(target=body, daemon=True)
    t.start()
    assert started.wait(10)
    state["url"] = f"http://127.0.0.1:{port}/"
    yield state
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


def test_a_replay_records_every_request_with_its_latency(server: dict[str, Any]) -> None:
    server["delay_s"], server["bodies"] = 0.05, 0
    c = lg.steady(40, 2)
    want = len(lg.arrivals(c, seed=3))
    recs = lg.run(server["url"], c, seed=3)
    assert len(recs) == want == server["bodies"] and want > 40
    assert all(r.status == 200 and r.latency_s >= 0.05 for r in recs)
    s = lg.summarize(recs, slo_ms=40)
    assert s["slo_attainment_pct"] == 0.0 and s["p50_ms"] >= 50


def test_the_replay_is_open_loop_a_slow_server_does_not_slow_the_sending(server: dict[str, Any]) -> None:
    server["delay_s"] = 1.0
    rp = lg.start(server["url"], lg.steady(30, 1.5), seed=4)
    recs = rp.join(30)
    sent = sorted(r.sent_s for r in recs)
    # every request was sent before the first answer came back (closed-loop would send one per second)
    assert len(recs) > 20 and sent[-1] < 1.7 and min(r.latency_s for r in recs) >= 1.0


def test_refused_connections_are_records_not_crashes() -> None:
    recs = lg.run(f"http://127.0.0.1:{_free_port()}/", lg.steady(20, 0.5), seed=5, timeout_s=2)
    assert recs and all(not r.ok and isinstance(r.status, str) for r in recs)
    assert lg.summarize(recs, slo_ms=100)["slo_attainment_pct"] == 0.0


def test_the_command_line_prints_one_json_summary(server: dict[str, Any], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    server["delay_s"] = 0.0
    out = tmp_path / "records.csv"
    assert lg.main(["--url", server["url"], "--curve", "steady:rps=20,duration=1", "--slo-ms", "1000",
                    "--records", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["sent"] == s["ok"] > 5 and s["slo_attainment_pct"] == 100.0
    assert out.read_text().splitlines()[0] == "sent_s,latency_s,status" and len(out.read_text().splitlines()) == s["sent"] + 1
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds,requests_per_s\n0,1\n2,-1\n")
    assert lg.main(["--url", server["url"], "--load-curve", str(bad)]) == 2
    assert "line 3: requests_per_s" in capsys.readouterr().err
