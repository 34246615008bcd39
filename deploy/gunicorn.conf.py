"""gunicorn settings for the FastCI webhook service.

    gunicorn -c deploy/gunicorn.conf.py 'fastci.app.web:create_app()'

The webhook answers in milliseconds (verify, claim, enqueue), so a few threaded workers hold
hundreds of deliveries a second; everything slow happens in RQ workers.

/metrics runs prometheus-client in multiprocess mode: PROMETHEUS_MULTIPROC_DIR (the systemd
unit gives a RuntimeDirectory; else a private temporary folder) is emptied here, before any
worker imports prometheus-client, and `child_exit` retires each dead worker's files.
"""

import multiprocessing
import os

from fastci.app.serve import child_exit, prepare_metrics_dir  # noqa: F401 (a gunicorn hook)

prepare_metrics_dir()

bind = os.environ.get("FASTCI_BIND", "127.0.0.1:8000")  # behind a TLS-terminating proxy
workers = int(os.environ.get("FASTCI_WEB_WORKERS", min(4, multiprocessing.cpu_count())))
worker_class = "gthread"
threads = 8
timeout = 30  # GitHub gives a webhook 10 s
graceful_timeout = 20
keepalive = 5
max_requests = 10000  # recycle workers now and then
max_requests_jitter = 1000
accesslog = "-"
# Never log headers, bodies or query strings: they carry signatures (an artifact link's is in
# its query) and payloads.
access_log_format = '%(h)s "%(m)s %(U)s" %(s)s %(b)s %(M)sms'
errorlog = "-"
