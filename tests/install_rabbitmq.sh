#!/bin/bash
# Install RabbitMQ for the AMQP tests, which start their own rabbitmq-server on 127.0.0.1 (own ports,
# own data folder). Idempotent. Debian's package starts a system broker on 5672 (and epmd on 4369):
# it is stopped and disabled, so it neither clashes with nor hides the test's own.
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q "install ok installed"; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends rabbitmq-server
    if [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now rabbitmq-server.service epmd.socket epmd.service 2>/dev/null || true
    else
        $SUDO service rabbitmq-server stop 2>/dev/null || true
        $SUDO update-rc.d rabbitmq-server disable 2>/dev/null || true
    fi
fi
python3 -c "import aio_pika" 2>/dev/null || python3 -m pip install -q "aio-pika>=9.4"
