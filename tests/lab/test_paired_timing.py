"""Speed-ups measured in pairs hold when the machine's load changes during the run: each method against the
baseline on the same prompt, back to back, and the median of the per-pair ratios (a fake clock, no real timing)."""

import statistics

import pytest

from diffusers_var_accel.lab.comparison import UNSTEADY_SPREAD, paired_speedup, time_interleaved

COSTS = {"baseline": 1.0, "fastvar": 0.5, "lazyvar": 0.6, "stagevar": 0.45, "arvar": 0.9}


class LoadedClock:
    """A clock under which the first ``slow_calls`` calls run ``factor`` times slower (a busy neighbour that
    leaves half-way through the run)."""

    def __init__(self, slow_calls: int, factor: float = 50.0):
        self.now, self.calls, self.slow_calls, self.factor = 0.0, 0, slow_calls, factor

    def __call__(self) -> float:
        return self.now

    def generate(self, method: str, item: int) -> str:
        self.now += COSTS[method] * (self.factor if self.calls < self.slow_calls else 1.0)
        self.calls += 1
        return f"{method}-{item}"


@pytest.mark.parametrize("num_items, repeats", [(6, 1), (3, 3), (2, 5)])
def test_a_load_change_half_way_leaves_every_speedup_within_1_3x_of_the_true_one(num_items, repeats):
    methods = list(COSTS)
    total = num_items * repeats * len(methods)
    # the first half of the calls (and one more: the change falls inside a round, after its baseline) run 50x slower
    clock = LoadedClock(slow_calls=total // 2 + 1)
    seconds, outputs = time_interleaved(clock.generate, methods, num_items, repeats, clock=clock)
    assert clock.calls == total and outputs["lazyvar"] == [f"lazyvar-{i}" for i in range(num_items)]
    whole_run_errors, spreads = [], []
    for m in methods[1:]:
        true = COSTS["baseline"] / COSTS[m]
        speedup, spread = paired_speedup(seconds["baseline"], seconds[m])
        assert true / 1.3 <= speedup <= true * 1.3, (m, speedup, true)
        spreads.append(spread)
        whole_run = statistics.median(seconds["baseline"]) / statistics.median(seconds[m])
        whole_run_errors.append(max(whole_run / true, true / whole_run))
    # the round the change fell in holds a bad pair (a slow baseline, a fast method): that row says unsteady
    assert max(spreads) > UNSTEADY_SPREAD
    assert max(whole_run_errors) > 1.3  # a ratio of the whole run's medians does not hold under this clock


def test_a_steady_machine_gives_the_exact_ratio_and_no_spread():
    clock = LoadedClock(slow_calls=0)
    seconds, _ = time_interleaved(clock.generate, list(COSTS), 4, 2, clock=clock)
    assert paired_speedup(seconds["baseline"], seconds["fastvar"]) == pytest.approx((2.0, 0.0))


def test_pairs_must_match():
    with pytest.raises(ValueError, match="as many baseline as method calls"):
        paired_speedup([1.0, 1.0], [0.5])
