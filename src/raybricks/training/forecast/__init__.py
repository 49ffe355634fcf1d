"""The forecasting task: ``series`` cleans a series onto its grid and cuts its backtest
windows, ``backtest`` trains one series, ``global_model`` fits one model over every
series, ``task`` runs them for the engine."""
