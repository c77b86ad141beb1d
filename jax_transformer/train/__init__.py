"""Training: the step, the loop, checkpoints, evaluation and figures.

    settings.py     DataSettings, ModelSettings, TrainSettings: train.py's flags, typed
    step.py         the loss, the paper's schedule, Adam, Trainer (jit-compiled steps, sharding)
    loop.py         run(): data, model, the loop, checkpoints, export, evaluation
    checkpoints.py  orbax training checkpoints (Checkpointer, restore_model)
    evaluation.py   held-out loss, exact match, sacreBLEU, chrF
    plots.py        the loss curve and an attention heatmap
"""
