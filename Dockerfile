# One image for the kneepoint collector (`kneepoint collect`) and app (`kneepoint serve
# --no-collect`); docker-compose.yaml runs both from it.
FROM python:3.11.11-slim-bookworm
WORKDIR /opt/kneepoint
COPY pyproject.toml README.md ./
COPY kneepoint ./kneepoint
COPY collectors ./collectors
COPY alerts ./alerts
COPY dashboards ./dashboards
COPY app ./app
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/kneepoint kneepoint \
    && mkdir -p /var/lib/kneepoint && chown kneepoint /var/lib/kneepoint
USER kneepoint
WORKDIR /var/lib/kneepoint
ENV KNEEPOINT_CONFIG=/etc/kneepoint/kneepoint.yaml
EXPOSE 8501
CMD ["kneepoint", "serve", "--no-browser"]
