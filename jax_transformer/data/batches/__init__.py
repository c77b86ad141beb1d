"""Where batches are formed: encoded sentences packed into rows of one shape, the rows
laid out as fixed-shape batches of a token budget, served epoch after epoch, resumable.

    rows.py     the row shape: bucket lengths, `fitting_row_shape` (train.py's one shape
                for a corpus), `positions_needed`; `pack_rows`, which sentences share a row
    packed.py   `PackedBatches`: each epoch's rows planned block by block, a batch's rows
                laid out as arrays (`make_batch`: segment ids, positions, bos/eos);
                `BatchIterator`, the resumable position a checkpoint saves

Around them, in jax_transformer/train/inputs.py: `make_batches` picks the row shape and
the budget (--max-tokens) of a run and makes one PackedBatches a split; its Prefetcher
builds the next batches on a thread and puts them on the devices.
"""
