"""Bad starts belong to the build that has them: the decision reads every start as well as the normal ones,
a pass at an earlier look is withdrawn when later starts show the candidate no better, and the bad-start
check fails a candidate shown to have more bad starts than the baseline."""

from __future__ import annotations

import numpy as np
import pytest

from cache_qualify.stats.verdict import BAD_STARTS, Assertion, Trials, Verdict, carry, evaluate

WAITS = tuple(Assertion("readiness_wait_ns", r, "gain", False, min_effect=2e8, unit="ns")
              for r in ("B-new-start", "A-third-read"))
MEANS = (2.1e9, 6.5e8)


def _blocked(values: np.ndarray) -> Trials:
    ids = tuple(range(values.size))
    return Trials(tuple(values), ids, ids)


def _waits(rng: np.random.Generator, n: int, *, faster: float, cand_bad: tuple[int, ...] = (),
           base_bad: tuple[int, ...] = (), factor: float = 4.0) -> dict[str, tuple[Trials, Trials]]:
    """Both waits of `n` starts per build; the candidate `faster` x the baseline on normal starts, and the
    given starts of each build bad (every wait of the start `factor` x longer)."""
    start = rng.lognormal(0, 0.09, (2, n))            # one disk-read factor per start, shared by its waits
    out = {}
    for a, mean in zip(WAITS, MEANS):
        base = mean * start[0] * rng.lognormal(0, 0.02, n)
        cand = faster * mean * start[1] * rng.lognormal(0, 0.02, n)
        base[list(base_bad)] *= factor
        cand[list(cand_bad)] *= factor
        out[a.id] = (_blocked(base), _blocked(cand))
    return out


def _mean_better(v: Verdict) -> bool:
    return float(np.mean(v.candidate)) < float(np.mean(v.baseline))


def test_a_candidates_bad_starts_count_against_it_and_a_worse_mean_never_passes() -> None:
    """Normal starts 40 % faster, but three of eight starts bad: over every start the candidate waits longer,
    so no wait gain passes, and the reason shows both readings in seconds."""
    samples = _waits(np.random.default_rng(1), 8, faster=0.6, cand_bad=(1, 4, 6))
    for v in evaluate(list(WAITS), samples, alpha=0.05):
        assert v.flagged and all(f.arm == "candidate" and f.worse for f in v.flagged)
        assert not _mean_better(v) and v.outcome != "pass"
        assert v.difference == pytest.approx(np.mean(v.candidate) - np.mean(v.baseline))
        assert v.normal_difference < 0 < v.difference and v.ci.low < v.normal_difference < v.difference <= v.ci.high
        assert "on the normal starts (flagged ones set aside) -" in v.reason and " s" in v.reason


def test_a_single_bad_start_of_the_lab_costs_a_large_gain_nothing() -> None:
    """One bad start of the candidate's (the lab's, or its own: one run cannot tell) against a gain of half
    the wait: the mean over every start is still far better, so the gain passes, as with a bad start of the
    baseline's, which never buys a pass by itself."""
    for bad in ({"cand_bad": (3,)}, {"base_bad": (3,)}):
        samples = _waits(np.random.default_rng(2), 8, faster=0.5, **bad)  # type: ignore[arg-type]
        for v in evaluate(list(WAITS), samples, alpha=0.05):
            assert v.flagged and v.outcome == "pass", v.reason
    same = _waits(np.random.default_rng(3), 8, faster=1.0, base_bad=(2,))
    assert all(v.outcome != "pass" for v in evaluate(list(WAITS), same, alpha=0.05))


def test_a_wait_gain_passes_only_where_the_mean_over_every_start_is_better() -> None:
    """Candidates whose normal starts are better but whose bad starts are their own, at random: every pass
    has the candidate's mean over all its starts better than the baseline's by more than the minimum effect."""
    rng = np.random.default_rng(4)
    passed = worse = 0
    for _ in range(150):
        n = int(rng.integers(5, 11))
        bad = tuple(int(i) for i in np.flatnonzero(rng.random(n) < 0.25))
        for v in evaluate(list(WAITS), _waits(rng, n, faster=0.7, cand_bad=bad), alpha=0.05):
            gain = float(np.mean(v.baseline) - np.mean(v.candidate))
            worse += gain <= v.assertion.min_effect
            if v.outcome == "pass":
                passed += 1
                assert gain > v.assertion.min_effect, v.reason
    assert passed >= 20 and worse >= 20


def test_a_pass_is_withdrawn_when_later_starts_show_the_candidate_no_better() -> None:
    """Sequential: both waits pass at the first look; the candidate's next starts are bad, and by the last look
    its mean over every start is worse, so the carried passes give way to that look's verdicts."""
    rng = np.random.default_rng(5)
    samples = _waits(rng, 10, faster=0.55, cand_bad=(5, 6, 7, 8, 9), factor=8.0)
    looks = (5, 10)

    def at(n: int, look: int) -> list[Verdict]:
        part = {k: tuple(Trials(t.values[:n], t.starts[:n], t.blocks[:n]) for t in pair)
                for k, pair in samples.items()}
        return evaluate(list(WAITS), part, alpha=0.05, look=look, looks=looks)  # type: ignore[arg-type]

    first = at(5, 1)
    assert [v.outcome for v in first] == ["pass", "pass"]
    kept = carry(first, at(10, 2))
    assert all(v.outcome != "pass" and not _mean_better(v) for v in kept)
    assert carry(first, first) == first   # a pass that still holds stays


def test_the_bad_start_check_fails_a_candidate_shown_to_have_more_and_is_decided_afresh() -> None:
    rng = np.random.default_rng(6)
    many = _waits(rng, 12, faster=0.6, cand_bad=(0, 2, 4, 6, 8, 10))
    *_, check = evaluate([*WAITS, BAD_STARTS], many, alpha=0.05)
    assert check.outcome == "fail" and check.p_value < 0.05
    assert check.reason.startswith("Fail: the candidate has more bad starts than the baseline: 6 of the "
                                   "candidate's 12 starts against 0 of the baseline's 12 (one-sided Fisher exact p")
    assert (check.baseline_mean, check.candidate_mean) == (0.0, 0.5)
    one = _waits(rng, 12, faster=0.6, cand_bad=(3,))
    *_, fine = evaluate([*WAITS, BAD_STARTS], one, alpha=0.05)
    assert fine.outcome == "pass" and "1 of the candidate's 12 starts against 0 of the baseline's 12" in fine.reason
    assert carry([check], [fine]) == [fine]   # never carried: later starts may show an excess, or none


def test_flagged_starts_are_numbered_from_one_as_the_report_numbers_trials() -> None:
    samples = _waits(np.random.default_rng(7), 8, faster=0.6, base_bad=(2,))
    [v, _] = evaluate(list(WAITS), samples, alpha=0.05)
    [flag] = v.flagged
    assert (flag.start, flag.block) == (2, 2)
    assert "Flagged start: baseline trial 3 (block 3): readiness_wait_ns studentized distance B-new-start +" \
        in v.reason
