"""Running one leg over cases: the runner (case -> rows, one failing case never stops a run), the reference cache
(float64 goldens by input hash), the legs' output caches, and the result file a run appends to, resumes and
finishes (locked, never over another run's file). Building runners and the worker pool is the application's
(:class:`harness.app.session.Run`)."""
