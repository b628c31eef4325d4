#!/usr/bin/env bash
# Runs once, when the postgres container initialises its data volume (docker-entrypoint-initdb.d).
# The service connects as `parity`: a plain role (no superuser, no CREATEDB, no CREATEROLE) that owns
# only the schema `parity` in the database `parity`. POSTGRES_USER (the superuser) is for operators.
set -euo pipefail
: "${POSTGRES_APP_PASSWORD:?set POSTGRES_APP_PASSWORD in .env}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
     -v app_password="$POSTGRES_APP_PASSWORD" <<'SQL'
CREATE ROLE parity LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE DATABASE parity OWNER postgres;
REVOKE ALL ON DATABASE parity FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE parity TO parity;
\connect parity
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE SCHEMA parity AUTHORIZATION parity;
ALTER ROLE parity IN DATABASE parity SET search_path = parity;
SQL
