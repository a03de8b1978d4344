"""actcodec.torch.limit.meter: the memory of where a model lives, the same interface for the
process (CPU) and a CUDA device's caching allocator (checked here with a stand-in for
torch.cuda's counters), and Step's limit on it ("free", a limit above what there is)."""
import time

import numpy as np
import pytest
import torch

import actcodec.torch as act
from actcodec.torch.limit import meter as meters

MiB = 1 << 20


class FakeCuda:
    """torch.cuda's counters for one device, driven by the test."""

    def __init__(self, total=8 << 30):
        self.total, self.allocated, self.reserved, self.max_reserved = total, 0, 0, 0
        self.max_allocated = 0
        self.emptied = 0

    def alloc(self, n):
        self.allocated += n
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.reserved = max(self.reserved, self.allocated)
        self.max_reserved = max(self.max_reserved, self.reserved)

    def free(self, n):
        self.allocated -= n

    def memory_stats_as_nested_dict(self, device):  # what the meter reads
        return {"reserved_bytes": {"all": {"current": self.reserved, "peak": self.max_reserved}},
                "allocated_bytes": {"all": {"current": self.allocated,
                                            "peak": self.max_allocated}}}

    def reset_peak_memory_stats(self, device):  # both counters, as torch's
        self.max_reserved, self.max_allocated = self.reserved, self.allocated

    def empty_cache(self):
        self.emptied += 1
        self.reserved = self.allocated

    def mem_get_info(self, device):
        return self.total - self.reserved, self.total

    def current_device(self):
        return 0

    def get_device_properties(self, device):
        return type("Props", (), {"total_memory": self.total})()

    fraction = 1.0

    def get_per_process_memory_fraction(self, device):
        return self.fraction

    def set_per_process_memory_fraction(self, fraction, device):
        assert isinstance(fraction, float) and 0 <= fraction <= 1
        self.fraction = fraction


def test_the_process_meter_reads_rss_and_its_peak():
    m = meters.ProcessMeter()
    assert 0 < m.live() <= m.held() + 64 * MiB
    before = m.held()
    with m.peak() as p:
        a = np.ones(100 * MiB, np.uint8)
        if p.sampled:
            # the kernel's counter could not be reset (RSS moved while it was: another
            # thread's frees): a sampling thread, which needs the GIL np.ones held, sees
            # what stays resident for a period
            time.sleep(0.05)
        del a
    assert p.nbytes - before >= 90 * MiB
    assert m.capacity() is None or m.capacity() >= m.held()


def test_the_cuda_meter_reads_the_caching_allocator():
    cuda = FakeCuda()
    m = meters.CudaMeter("cuda:0", cuda)
    cuda.alloc(100)
    cuda.free(40)
    assert (m.live(), m.held()) == (60, 100)
    assert m.capacity() == cuda.total
    m.give_back()
    assert cuda.emptied == 1 and m.held() == 60


def test_cuda_peaks_nest_without_losing_the_outer_ones():
    cuda = FakeCuda()
    m = meters.CudaMeter("cuda:0", cuda)
    with m.peak() as outer:
        cuda.alloc(500)
        cuda.free(500)
        cuda.empty_cache()
        with m.peak() as inner:  # resets the device's counter: the outer peak keeps its 500
            cuda.alloc(200)
            cuda.free(200)
        assert inner.nbytes == 200
    assert outer.nbytes == 500


def test_cuda_live_peaks_and_reserved_peaks_share_one_reset_without_losing_either():
    # the allocated bytes' peak (a probe's moments) and the reserved bytes' (the probe's own
    # peak) are reset by one call: entering either folds both into what is open
    cuda = FakeCuda()
    m = meters.CudaMeter("cuda:0", cuda)
    with m.peak() as reserved:
        cuda.alloc(300)
        cuda.free(300)  # the cache keeps 300 reserved
        with m.live_peak() as first:  # resets both counters
            cuda.alloc(100)
            cuda.free(100)
            with m.live_peak() as nested:
                cuda.alloc(50)
                assert nested.nbytes == 50
                cuda.free(50)
            assert first.nbytes == 100  # kept across the nested reset
        cuda.empty_cache()
        with m.peak() as inner:
            cuda.alloc(20)
            with m.live_peak() as late:
                cuda.alloc(30)
            cuda.free(50)
        assert (inner.nbytes, late.nbytes) == (50, 50)
    assert reserved.nbytes == 300


def test_a_probes_moments_on_a_cuda_meter_are_its_allocated_bytes():
    from actcodec.torch.limit import step_profile
    cuda = FakeCuda()
    m = meters.CudaMeter("cuda:0", cuda)
    cuda.alloc(1000)  # the floor
    moments = step_profile.Moments(m, base=m.live())
    with m.peak() as probe:
        moments.start()
        cuda.alloc(400)  # forward holds 400
        moments.begin(1)  # block 1's forward again, in backward
        cuda.alloc(250)
        cuda.free(250)
        moments.end(1)
        moments.begin(0)
        cuda.alloc(100)
        cuda.free(500)
        moments.end(0)
        cuda.alloc(10)
        moments.stop()
    assert moments.blocks == {1: 650, 0: 500} and moments.outside == 400
    assert probe.nbytes == 1650


def test_meter_for_picks_by_device_and_names_what_is_supported():
    assert isinstance(meters.meter_for(torch.nn.Linear(2, 2)), meters.ProcessMeter)
    with pytest.raises(ValueError, match="this model is on meta"):
        meters.meter_for(torch.nn.Linear(2, 2).to("meta"))
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to("meta"))
    with pytest.raises(ValueError, match="one device"):
        meters.meter_for(mixed)


def mse(m, b):
    return m(b).pow(2).mean()


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 64))


def test_limit_free_plans_for_what_the_machine_has(monkeypatch):
    read = []  # what the machine had when asked (the step gives back pages: RSS moves)

    def capacity(self):
        read.append(meters.resident.rss() + 2048 * MiB)
        return read[-1]

    monkeypatch.setattr(meters.ProcessMeter, "capacity", capacity)
    step = act.Step(small_model(), limit="free", loss_fn=mse)
    step(torch.randn(32, 64))
    assert step.limit == "free"
    assert step.stats.limit in read


def test_a_limit_above_what_there_is_warns_and_is_planned_as_it(monkeypatch):
    monkeypatch.setattr(meters.ProcessMeter, "capacity",
                        lambda self: meters.resident.rss() + 1024 * MiB)
    step = act.Step(small_model(), limit=1 << 40, loss_fn=mse)
    with pytest.warns(RuntimeWarning, match="above what cpu has"):
        step(torch.randn(32, 64))
    assert step.stats.limit < 1 << 40


class SeldomMeter(meters.ProcessMeter):
    """The process's meter, read as CUDA's is: its capacity (a driver call there) counted."""

    capacity_each_step = False

    def __init__(self, calls, has):
        self.calls, self.has = calls, has

    def capacity(self):
        self.calls.append(1)
        return self.has


def test_a_limit_in_bytes_reads_a_devices_capacity_when_set_and_after_running_out(monkeypatch):
    calls, has = [], [meters.resident.rss() + 8192 * MiB]  # a list: read when called
    step = act.Step(small_model(), limit=1 << 40, loss_fn=mse)
    monkeypatch.setattr(step, "_meter", lambda strict: SeldomMeter(calls, has[0]))
    x = torch.randn(32, 64)
    with pytest.warns(RuntimeWarning, match="above what"):
        step(x)
    step(x)
    assert len(calls) == 1 and step.stats.limit == has[0]
    step.limit = 1 << 41
    step(x)
    assert len(calls) == 2
    within = step._within
    monkeypatch.setattr(step, "_within", lambda *a: (_ for _ in ()).throw(
        torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")))
    with pytest.raises(act.MemoryLimitError):
        step(x)
    monkeypatch.setattr(step, "_within", within)
    step(x)  # the device may have less after running out: read again
    assert len(calls) == 3 and step.stats.limit == has[0]
    step.limit = "free"  # read at every step
    step(x)
    step(x)
    assert len(calls) == 5


def test_limit_free_where_nothing_says_how_much_is_refused(monkeypatch):
    monkeypatch.setattr(meters.ProcessMeter, "capacity", lambda self: None)
    with pytest.raises(ValueError, match="limit='free'"):
        act.Step(small_model(), limit="free", loss_fn=mse)(torch.randn(8, 64))


def test_a_cuda_probe_starts_from_an_empty_cache():
    # the reservation only grows while the cache is kept: a probe after a larger one would
    # read the larger one's peak (recomputation would look like it saves nothing)
    cuda = FakeCuda()
    m = meters.CudaMeter("cuda:0", cuda)
    cuda.alloc(900)
    cuda.free(900)
    for fresh in (False, True):
        m.start_probe(fresh)
        with m.peak() as p:
            cuda.alloc(300)
            cuda.free(300)
        assert p.nbytes == 300
    assert cuda.emptied == 2


class RecordingMeter(meters.ProcessMeter):
    def __init__(self):
        self.calls = []

    def start_probe(self, fresh):
        self.calls.append(("start", fresh))
        super().start_probe(fresh)

    def synchronize(self):
        self.calls.append(("sync",))


def test_every_probe_starts_and_ends_through_the_meter():
    from actcodec.torch.limit import step_profile
    model = small_model()
    params = list(model.parameters())
    meter = RecordingMeter()
    x = torch.randn(16, 64)
    step_profile.probe(lambda n: mse(model, x[:n]), params, 4, meter=meter)
    step_profile.probe(lambda n: mse(model, x[:n]), params, 8, fresh=True, meter=meter)
    assert meter.calls == [("start", False), ("sync",), ("start", True), ("sync",)]


def test_meters_of_one_cuda_device_share_its_peak_reader():
    # the device's counter is the process's: two readers would erase each other's peaks
    a, b = meters.CudaMeter("cuda:0"), meters.CudaMeter("cuda:0")
    assert a.counter is b.counter and a.live_counter is b.live_counter
    assert a.live_counter.group == [a.counter, a.live_counter]
    assert meters.CudaMeter("cuda:1").counter is not a.counter


def test_the_cuda_meter_keeps_the_allocator_to_the_limit_while_capped():
    # the caching allocator's own cap: a block that does not fit what is cached frees the
    # cache and retries before reserving past the limit (fragments would otherwise grow it)
    cuda = FakeCuda(total=8 << 30)
    m = meters.CudaMeter("cuda:0", cuda)
    with m.capped(2 << 30):
        assert cuda.fraction == 0.25
    assert cuda.fraction == 1.0
    cuda.fraction = 0.5  # the user's own cap stays the tighter one, and comes back after
    with pytest.raises(RuntimeError, match="inside"):
        with m.capped(6 << 30):
            assert cuda.fraction == 0.5
            raise RuntimeError("inside")
    assert cuda.fraction == 0.5


def test_overlapping_steps_on_one_device_keep_the_tightest_cap_and_restore_the_users():
    # two Steps in two threads on one device: the allocator's fraction is the process's, so
    # the one ending first must not lift the other's cap, nor the last leave one behind
    cuda = FakeCuda(total=8 << 30)
    cuda.fraction = 0.75  # the user's own
    a, b = meters.CudaMeter("cuda:0", cuda), meters.CudaMeter("cuda:0", cuda)
    b.cap = a.cap  # as meters of torch.cuda share theirs per device
    first, second = a.capped(2 << 30), b.capped(4 << 30)
    first.__enter__()
    assert cuda.fraction == 0.25
    second.__enter__()
    assert cuda.fraction == 0.25
    first.__exit__(None, None, None)
    assert cuda.fraction == 0.5  # the other step's limit, still running
    second.__exit__(None, None, None)
    assert cuda.fraction == 0.75


def test_meters_of_one_cuda_device_share_its_allocator_cap():
    a, b = meters.CudaMeter("cuda:0"), meters.CudaMeter("cuda:0")
    assert a.cap is b.cap and meters.CudaMeter("cuda:1").cap is not a.cap


class OlderCuda(FakeCuda):
    get_per_process_memory_fraction = None  # an older torch: a setter, no getter


def test_without_the_fractions_getter_the_allocator_is_left_as_it_is():
    # a user's own fraction could not be put back after the step: none is set
    cuda = OlderCuda(total=8 << 30)
    cuda.fraction = 0.5
    with meters.CudaMeter("cuda:0", cuda).capped(2 << 30):
        assert cuda.fraction == 0.5
    assert cuda.fraction == 0.5


class ColdMeter(RecordingMeter):
    cold_probes = True


def test_a_probe_from_a_cold_cache_is_timed_again_without_counting():
    from actcodec.torch.limit import step_profile
    model = small_model()
    params = list(model.parameters())
    meter = ColdMeter()
    x = torch.randn(16, 64)
    counted = step_profile.probe(lambda n: mse(model, x[:n]), params, 4, meter=meter)
    # one start (the counted run's), its sync, then the timed run's sync
    assert meter.calls == [("start", False), ("sync",), ("sync",)]
    assert counted.peak >= 0 and counted.surveys and counted.seconds > 0
    # a probe whose peak alone is wanted (recomputing every block): run once, uncounted
    meter.calls.clear()
    lean = step_profile.probe(lambda n: mse(model, x[:n]), params, 4, meter=meter,
                              peak_only=True)
    assert meter.calls == [("start", False), ("sync",)]
    assert lean.peak >= 0 and not lean.surveys and not lean.saved


def test_an_out_of_memory_error_under_the_cap_is_a_memory_limit_error(monkeypatch):
    from actcodec.torch.limit import limit_plan
    step = act.Step(small_model(), limit="4GiB", loss_fn=mse)
    x = torch.randn(8, 64)
    step(x)
    plan, calibrated = step.plan, step._planning.measured.worst

    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")

    monkeypatch.setattr(step, "_within", out_of_memory)
    with pytest.raises(act.MemoryLimitError, match="caching allocator was kept") as info:
        step(x)
    assert isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)
    # (the floor, read again, may have moved by a page since)
    assert info.value.needed == pytest.approx(step.smallest_limit(), abs=1 << 20)
    assert "smallest limit" in str(info.value)
    # the plan that ran out is judged as peaking past the room it had
    profile = step._planning.profile
    key = limit_plan.memory_key(profile, plan.micro_batches, plan.recompute, plan.storage,
                                plan.chunks)
    floor = meters.ProcessMeter().live()
    assert step._planning.measured.peaks[key] > (4 << 30) - floor - (64 << 20)
    # ... and nothing else: read as the model's error, a room of 4 GiB over a plan of a few
    # MiB made every plan hundreds of times its model, and the next step was refused
    assert step._planning.measured.worst == calibrated
    monkeypatch.undo()
    step(x)
    assert step.plan != plan


class FakeEvent:
    """torch.cuda.Event's timing, on a clock the test moves; `done` as query() says."""
    now = 0.0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t, self.done = None, True

    def record(self, stream=None):
        self.t, self.stream = FakeEvent.now, stream

    def query(self):
        return self.done

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # milliseconds, as torch's


def test_the_device_clock_adds_up_each_blocks_forwards_once_the_device_has_run_them():
    cuda = FakeCuda()
    cuda.Event = FakeEvent
    cuda.current_stream = lambda device: ("stream of", device)
    clock = meters.CudaMeter("cuda:1", cuda).step_clock()
    assert meters.ProcessMeter().step_clock() is None  # the CPU's probes time a step well
    FakeEvent.now = 0.0
    clock.begin("step")
    for micro_batch in range(2):
        clock.begin(0)
        FakeEvent.now += 0.25
        clock.end(0)
        clock.begin(1)
        clock.begin(1)  # a block called inside itself nests
        FakeEvent.now += 0.5
        clock.end(1)
        clock.end(1)
    assert clock.read() is None  # the step has not ended
    clock.end("step")
    last = clock._marks[-1][2]
    last.done = False  # the device has not got there yet
    assert clock.read() is None
    last.done = True
    assert clock.read() == pytest.approx({0: 0.5, 1: 2.0, "step": 1.5})
    # on the model's device, whichever is current (else they time another device's work)
    assert {e.stream for _, *pair in clock._marks for e in pair} == \
        {("stream of", torch.device("cuda:1"))}


def test_a_step_on_a_device_clock_hands_its_times_to_the_next_steps_plan(monkeypatch):
    # on the CPU with a device's clock: the blocks' forwards are what the clock read
    from actcodec.torch.limit import planning

    class Clock(meters.DeviceClock):
        def read(self):
            got = super().read()
            return None if got is None else {k: 1e-3 for k in got}

    cuda = FakeCuda()
    cuda.Event = FakeEvent
    cuda.current_stream = lambda device: None
    monkeypatch.setattr(meters.ProcessMeter, "step_clock", lambda self: Clock(cuda, "cuda:0"))
    learnt = []
    monkeypatch.setattr(planning.Planning, "learn_times",
                        lambda self, plan, times: learnt.append((plan, times)))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.relu(self.lin(x))

    model = torch.nn.Sequential(Block(), Block(), Block(), torch.nn.Linear(64, 1))
    step = act.Step(model, limit="4GiB", loss_fn=mse)
    x = torch.randn(8, 64)
    step(x)
    assert not learnt  # nothing to read before the first step has run
    step(x)
    assert learnt and learnt[0][0] == step.plan
    assert set(learnt[0][1]) == {0, 1, 2, "step"}


def test_a_fresh_probe_does_not_count_the_pages_a_probe_before_it_freed():
    # a probe's large tensors freed below one it left live (lazy state: a cache, a mask) stay
    # mapped in the store; a probe that starts fresh gives them back, or its peak, read as
    # RSS above the live bytes it started from, would count them (a Gemma 2's lean probes at
    # 256 to 1024 tokens each read 312 MiB, its largest moment being 100)
    from actcodec import store as stores
    from actcodec.torch.limit import step_profile
    from actcodec.torch.save import allocator as allocators

    allocators.ensure()
    if not allocators.installed():
        pytest.skip("actcodec's allocator could not be built here")
    freed = torch.ones(64 * MiB // 4)  # from the store, its pages touched
    kept = torch.ones(2 * MiB // 4)    # above it
    del freed
    stores.new_step(None)
    stores.new_step(None)
    model = small_model()
    x = torch.randn(16, 64)
    out = step_profile.probe(lambda n: mse(model, x[:n]), list(model.parameters()), 8,
                             fresh=True, meter=meters.ProcessMeter(), peak_only=True)
    assert out.peak < 32 * MiB, out.peak / MiB
    del kept
