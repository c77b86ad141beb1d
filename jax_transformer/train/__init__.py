"""Training: the run and its maths, the process plumbing under it, and its records.

    run.py          TrainingRun: prepare, the loop, export, evaluate
    settings.py     DataSettings, ModelSettings, TrainSettings: train.py's flags, typed;
                    each says whether a resume may change it
    run_args.py     the settings' history: older run_args.json files in today's names
    corpus.py       the corpus the data flags name
    inputs.py       the prepared corpus, the tokenizer, the batches
    task.py         Task: translation.py (--task translate), language_model.py (--task lm)
    step.py         the loss, the schedules, Adam, build_trainer, Trainer (jit-compiled steps)
    prefetch.py     the next batches on the devices ahead of use
    late_metrics.py the step metrics read late, checked finite
    evaluation.py   held-out loss and nll, exact match, sacreBLEU, chrF, unigram entropy
    finetune.py     --init-from: a checkpoint's config, weights and tokenizer
    compiling.py    ahead-of-time compiles, the persistent cache, compile counts
    checkpoints.py  orbax training checkpoints (Checkpointer, restore_model), damaged ones set aside
    workdir.py      the work directory: its lock, run_args.json, metrics.jsonl, atomic writes
    tensorboard.py  TensorBoard event files: metrics.jsonl's numbers as scalars
    plots.py        the loss curve and an attention heatmap
    report.py       eval.json's "training"
    interrupts.py   SIGINT/SIGTERM and --time-budget: finish the step, save, stop
    distributed.py, peers.py   --distributed: joining, the other processes, agreed stops
    jax_variables.py the variables JAX reads (JAX_PLATFORMS, ...) checked, as bad input
    cpu_devices.py, host_memory.py, disk_full.py   a CPU split into devices, freed host
                    memory kept, a full disk as one line
"""
