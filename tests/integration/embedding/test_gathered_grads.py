"""A replicated group's gradients gathered over two real gloo ranks: every rank ends with the record one process
makes of both ranks' gradients, in rank order, whatever each rank leaves out (bags of one id, scales of 1)."""

from pathlib import Path

import torch

from embedding.gathered_grads import GradLayout, LocalGrads, gather_grads
from embedding.sharding import GradRecord
from support.gloo_jobs import free_port, gloo_gang, start_ranks

DIM = 3

# What each rank sends, by case: (ids, bag of each id or None, scales or None, number of bags).
CASES: dict[str, list[tuple[list[int], list[int] | None, list[float] | None, int]]] = {
    "one id a bag on both": [([4, 1, 4], None, None, 3), ([0, 9], None, None, 2)],
    "bags and scales on one rank only": [([4, 1, 7], [0, 0, 2], [0.5, 2.0, 3.0], 3), ([0, 9], None, None, 2)],
    "bags on one, scales on the other": [([2, 3], None, [0.25, 4.0], 2), ([5, 5, 6], [1, 1, 1], None, 2)],
    "no id on one rank": [([], None, None, 0), ([8, 2, 8], [0, 1, 1], [1.0, 0.5, 2.0], 2)],
}


def sent(case: str, rank: int) -> LocalGrads:
    ids, bags, scales, num_bags = CASES[case][rank]
    rows = torch.arange(num_bags * DIM, dtype=torch.float32).view(num_bags, DIM) + 100 * rank
    return LocalGrads(
        torch.tensor(ids, dtype=torch.int64),
        [rows[:1], rows[1:]],  # in pieces, as autograd hands a group's features
        None if bags is None else torch.tensor(bags, dtype=torch.int64),
        None if scales is None else torch.tensor(scales),
    )


def expected(case: str) -> GradRecord:
    """The record of both ranks' gradients, made by hand."""
    ids, index, scales, rows, first_row = [], [], [], [], 0
    for rank in range(2):
        local = sent(case, rank)
        num_ids = local.ids.numel()
        bags = local.bag_of_each_id if local.bag_of_each_id is not None else torch.arange(num_ids)
        ids.append(local.ids)
        index.append(bags + first_row)
        scales.append(local.scales if local.scales is not None else torch.ones(num_ids))
        rows.append(torch.cat(list(local.grad_pieces)))
        first_row += rows[-1].size(0)
    any_scales = any(sent(case, rank).scales is not None for rank in range(2))
    return GradRecord(torch.cat(ids), (torch.cat(rows),), torch.cat(index), torch.cat(scales) if any_scales else None)


def gather_every_case(rank: int, port: int, folder: Path) -> None:
    with gloo_gang(rank, 2, port) as gang:
        records = {}
        for case in CASES:
            local = sent(case, rank)
            num_bags = sum(piece.size(0) for piece in local.grad_pieces)
            layout = GradLayout(
                gang, num_bags, local.ids.numel(), local.bag_of_each_id is not None, local.scales is not None
            )
            record = gather_grads(gang, local, layout, DIM)
            records[case] = {
                "ids": record.ids,
                "rows": torch.cat(record.grad_rows),
                "index": record.grad_index,
                "scales": record.grad_scale,
            }
        torch.save(records, folder / f"rank_{rank}.pt")


def test_every_rank_records_both_ranks_gradients_in_rank_order(tmp_path: Path) -> None:
    start_ranks(gather_every_case, (free_port(), tmp_path), world_size=2)

    for rank in range(2):
        records = torch.load(tmp_path / f"rank_{rank}.pt", weights_only=True)
        for case, record in records.items():
            want = expected(case)
            assert torch.equal(record["ids"], want.ids), case
            # Row by row, as the kernel reads them: each id's gradient row, scaled.
            got = record["rows"][record["index"]]
            made = want.grad_rows[0][want.grad_index]
            assert torch.equal(got, made), case
            assert torch.equal(record["index"], want.grad_index), case
            if want.grad_scale is None:
                assert record["scales"] is None, case
            else:
                assert torch.equal(record["scales"], want.grad_scale), case
