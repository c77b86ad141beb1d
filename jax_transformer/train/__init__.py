"""Training: the run and its maths here; the settings, the tasks, the process under the
run and what it writes in folders of their own.

    run.py          run(settings, init): the process set up, the work directory locked;
                    prepare(), which builds the run as data (a PreparedRun); then the
                    loop, the export and the final evaluation
    loop.py         PreparedRun, what the loop reads; train(run): the training loop
    export.py       WORKDIR/export and the final evaluation (eval.json); start_eval.json
    corpus.py       the corpus the data flags name
    inputs.py       the prepared corpus, the tokenizer, the batches; the Prefetcher that
                    puts the next ones on the devices ahead of use
    step.py         the loss, the schedules, Adam, build_trainer, Trainer (jit-compiled steps)
    selection.py    Policy (which steps are evaluated and saved), --keep-best, --patience,
                    --export last | best | average
    finetune.py     --init-from: a checkpoint's config, weights and tokenizer
    checkpoints.py  orbax checkpoints of step.py's TrainState (Checkpointer, restore_model),
                    damaged ones set aside
    disk_full.py    a full disk, or checkpoints that refuse writes, as one line naming
                    the checkpoint a resume starts from
    distributed.py  --distributed: joining the other processes, ending together
    settings/       train.py's flags, typed (RunSettings): data.py, model.py (--preset),
                    training.py, fields.py (a setting: its flag, whether a resume may
                    change it), history.py (older run_args.json files in today's names),
                    resume.py (run_args.json: the settings a resume must repeat, checked)
    tasks/          what --task trains and how each judges a model: Task and TASKS
                    (__init__.py), translation.py (--task translate), language_model.py
                    (--task lm), metrics.py (held-out loss and nll, exact match,
                    sacreBLEU, chrF, unigram entropy)
    runtime/        the process, knowing nothing of train.py's settings: signals.py
                    (SIGINT/SIGTERM for every command), interrupts.py (train.py's deferred
                    stops, --time-budget), peers.py (the other processes: a watch, posted
                    failures, agreed stops), compiling.py (ahead-of-time compiles, the
                    persistent cache, compile counts), host_memory.py (glibc keeps freed
                    host memory), process_clock.py (seconds since the process started),
                    cpu_devices.py (--cpu-devices: a CPU split into JAX devices),
                    jax_variables.py (JAX_PLATFORMS, ... checked as bad input),
                    sharding.py (the data x fsdp mesh; --fsdp's split of the state)
    records/        what a run writes as it goes: workdir.py (the lock, metrics.jsonl,
                    files written whole), tensorboard.py, plots.py (the loss curve, an
                    attention heatmap), late_metrics.py (step metrics read late, checked
                    finite), report.py (eval.json's "training")
"""
