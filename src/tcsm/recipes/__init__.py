"""Post-training recipes: one folder per method — its config schema and registry entries (`builder`), and the run
config it composes from a pre-trained run with its report (`compose`). The method's math lives in
`tcsm.posttrain.<method>`."""
