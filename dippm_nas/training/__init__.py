"""Training GraphSAGE checkpoints: examples and splits from the dataset, the training loop, evaluation on
held-out rows, and the novelty floors. The trained :class:`~dippm_nas.predictor.GnnPredictor` is written with
its :meth:`~dippm_nas.predictor.GnnPredictor.save`.
"""

from dippm_nas.training._evaluate import (evaluate_checkpoint, evaluate_examples, evaluate_predictions, few_shot_curve,
                                          metrics_table, regression_metrics, scatter_png, write_report)
from dippm_nas.training._examples import (DEVICE_ALIASES, SPLIT_MODES, Example, featurize_examples,
                                          heldout_timm_families, is_timm, labels_log, load_examples, split_examples,
                                          split_fraction, timm_family)
from dippm_nas.training._novelty import (COVERAGE, GRADED_MIN_ROWS, MAX_REFERENCE, NOVELTY_QUANTILE, SHRINK_GRID,
                                         fit_graded_floor, fit_novel_floor, fit_shrink_width, reference_set, split_d0)
from dippm_nas.training._train import (TrainConfig, attach_novelty_reference, fit_std_floor, train_ensemble,
                                       train_predictor)

__all__ = ["Example", "DEVICE_ALIASES", "SPLIT_MODES", "load_examples", "split_fraction", "timm_family", "is_timm",
           "heldout_timm_families", "split_examples", "featurize_examples", "labels_log",
           "TrainConfig", "train_ensemble", "fit_std_floor", "attach_novelty_reference", "train_predictor",
           "regression_metrics", "metrics_table", "evaluate_examples", "evaluate_predictions", "write_report", "scatter_png",
           "few_shot_curve", "evaluate_checkpoint",
           "MAX_REFERENCE", "NOVELTY_QUANTILE", "COVERAGE", "SHRINK_GRID", "reference_set", "fit_novel_floor",
           "split_d0", "fit_shrink_width", "GRADED_MIN_ROWS", "fit_graded_floor"]
