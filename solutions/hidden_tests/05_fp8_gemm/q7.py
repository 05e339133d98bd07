"""Lab 5 q7, hidden: five ranks with the outlier in a middle shard, and two shards that share the amax."""

from otter.test_files import test_case

name = "q7"


@test_case(name="q7 hidden: five ranks, the largest magnitude in the third shard; a tie between shards", hidden=True)
def test_q7_other_layouts(fp8_gather):
    from kernels.checks import lab05

    lab05.check_fp8_gather(fp8_gather, seed=50507, layouts="hidden")
