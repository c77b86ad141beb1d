"""Training: the step, the loop, checkpoints, evaluation and figures.

    settings.py     DataSettings, ModelSettings, TrainSettings: train.py's flags, typed
    step.py         the loss, the paper's schedule, Adam, Trainer (jit-compiled steps, sharding)
    loop.py         run(): data, model, the loop, checkpoints, export, evaluation
    translation.py  --task translate: sentence pairs, the encoder-decoder, test translations
    language_model.py  --task lm: lines of text, a decoder-only model, test continuations
    checkpoints.py  orbax training checkpoints (Checkpointer, restore_model), damaged ones set aside
    workdir.py      the work directory: its lock, run_args.json, metrics.jsonl, atomic writes
    tensorboard.py  TensorBoard event files: metrics.jsonl's numbers as scalars
    interrupts.py   SIGINT/SIGTERM: finish the step, save, stop
    evaluation.py   held-out loss and nll, exact match, sacreBLEU, chrF, unigram entropy
    plots.py        the loss curve and an attention heatmap
    finetune.py     --init-from: start from a checkpoint directory with its own tokenizer
"""
