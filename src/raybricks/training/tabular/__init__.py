"""The tabular task (regression, binary, multiclass): ``segment`` trains one segment,
``large`` one segment too large for one worker (Ray Train), ``task`` runs them for the
engine."""
