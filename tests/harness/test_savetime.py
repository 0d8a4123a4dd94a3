"""The allowance between the harness's stop and a checkpoint report: its parts and the write it measures."""

from evolve.harness.savetime import WRITE_FACTOR, SaveAllowance, typical_step_s, write_seconds


def test_the_typical_step_is_the_median_interval_between_reports():
    assert typical_step_s([]) == typical_step_s([5.0]) == 0.0
    assert typical_step_s([0.0, 0.1, 0.2, 0.3, 9.0]) == 0.1  # one long pause does not count


def test_the_step_in_flight_counts_at_most_the_floor():
    # reports far apart (a program reporting one step in many) cannot widen the window
    assert SaveAllowance.of(floor_s=0.5, step_stamps=[0.0, 0.06, 0.12]).total_s == 0.56
    assert SaveAllowance.of(floor_s=0.5, step_stamps=[0.0, 5.0, 10.0]).total_s == 1.0


def test_the_write_is_measured_on_this_machine_and_leaves_nothing(tmp_path):
    seconds = write_seconds(8 << 20, tmp_path)
    assert seconds > 0.0 and not list(tmp_path.iterdir())
    allowance = SaveAllowance.of(floor_s=0.5, step_stamps=[]).with_write(8 << 20, tmp_path)
    assert allowance.write_s is not None and allowance.total_s == 0.5 + allowance.write_s
    assert f"{WRITE_FACTOR:g} x the" in allowance.describe()
