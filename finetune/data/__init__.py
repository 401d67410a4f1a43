"""The data phase: finding the sources (sources, split_zip), loading them (loading), the row and label rules
(checks, labels), bringing them to the pipeline's shape (prepare), the download stage's work (download),
tokenization, batches and the rules a collated batch obeys (collate_check)."""
