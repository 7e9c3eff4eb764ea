"""The model code shipped inside every exported folder (copied there as plain files, so these
modules import only torch and transformers, never `prism`)."""
