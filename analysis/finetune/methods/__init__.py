"""One module per fine-tuning method, each declaring one ``SPEC`` (`analysis.finetune.spec`);
`analysis.finetune.registry` finds them. This file stays empty."""
