"""What is made of a results file: the Markdown report (:mod:`~bench.report.markdown`), its plots
(:mod:`~bench.report.plots`), and two runs compared (:mod:`~bench.report.compare`)."""
