from embedding import EmbeddingTableConfig, plan_sharding
from embedding.planner import row_wise, table_wise


def table(name: str, num_rows: int, **kwargs: object) -> EmbeddingTableConfig:
    return EmbeddingTableConfig(name, num_rows, 16, (name,), **kwargs)  # type: ignore[arg-type]


def test_planner_replicates_tiny_splits_big_and_balances_the_rest() -> None:
    tables = [
        table("tiny", 100),
        table("big", 1_000_000),
        table("a", 300_000),
        table("b", 200_000),
        table("c", 150_000),
    ]
    plan = plan_sharding(tables, world_size=2)

    assert plan["tiny"].placement == "replicated"
    assert plan["big"].placement == "row_wise"
    assert plan["big"].row_bounds == (0, 500_000, 1_000_000)
    owners = {name: plan[name].row_bounds.index(plan[name].num_rows) - 1 for name in ("a", "b", "c")}
    assert all(plan[name].placement == "table_wise" for name in owners)
    # The largest goes first to rank 0; the next two to rank 1, then the lighter rank.
    assert owners == {"a": 0, "b": 1, "c": 1}


def test_config_placement_overrides_the_planner() -> None:
    plan = plan_sharding([table("tiny", 100, placement="row_wise"), table("x", 10_000, placement="replicated")], 3)
    assert plan["tiny"] == row_wise(100, 3)
    assert plan["x"].placement == "replicated"
    assert plan["x"].local_rows(2) == (0, 10_000)


def test_one_rank_holds_every_row() -> None:
    plan = plan_sharding([table("a", 100_000), table("b", 200_000)], world_size=1)
    assert plan["a"] == table_wise(100_000, 0, 1)
    assert plan["b"].local_rows(0) == (0, 200_000)


def test_row_and_table_wise_ranges_cover_the_table_once() -> None:
    for sharding in (row_wise(10, 4), table_wise(10, 2, 4)):
        ranges = [sharding.local_rows(rank) for rank in range(4)]
        assert sum(end - start for start, end in ranges) == 10
        assert ranges[0][0] == 0 and ranges[-1][1] == 10
    assert table_wise(10, 2, 4).local_rows(2) == (0, 10)
    assert row_wise(10, 4).local_rows(3) == (9, 10)


def test_tables_up_to_8_mib_are_replicated_on_several_ranks_only() -> None:
    at_limit, above = table("at_limit", 131_072), table("above", 131_073)  # 16 floats a row: 8 MiB and one row more
    many = plan_sharding([at_limit, above, table("big", 1_000_000)], world_size=2)
    one = plan_sharding([at_limit], world_size=1)

    assert many["at_limit"].placement == "replicated"
    assert many["above"].placement == "table_wise"
    assert one["at_limit"] == table_wise(131_072, 0, 1)
