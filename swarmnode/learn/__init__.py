"""The objective: one sample record from scoring to the loss, F-TIS and its kin, and training on
another tokenizer family by span."""
