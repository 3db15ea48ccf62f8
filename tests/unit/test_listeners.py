"""Listener settings: Kafka's names parsed once, every mistake a ConfigError naming the property."""

from __future__ import annotations

import pytest

from localcluster.broker.config import BrokerConfig, ConfigError, read_properties_file
from localcluster.broker.listeners import (
    ListenerConfigError,
    listener_settings,
    parse_listeners,
    parse_protocol_map,
)
from localcluster.metadata_types import EndPoint

MAP = "CLIENT:PLAINTEXT,BROKER:SASL_PLAINTEXT"


def test_listeners_take_their_protocol_from_the_map_or_their_name():
    protocols = parse_protocol_map(MAP)
    assert parse_listeners("CLIENT://127.0.0.1:9092,BROKER://10.0.0.1:9093,PLAINTEXT://:0",
                           protocols) == (
        EndPoint("CLIENT", "127.0.0.1", 9092, "PLAINTEXT"),
        EndPoint("BROKER", "10.0.0.1", 9093, "SASL_PLAINTEXT"),
        EndPoint("PLAINTEXT", "", 0, "PLAINTEXT"))  # fmt: skip


def test_lower_case_names_are_kafkas_upper_case_and_ipv6_hosts_lose_their_brackets():
    (endpoint,) = parse_listeners("client://[::1]:9092", {"CLIENT": "PLAINTEXT"})
    assert endpoint == EndPoint("CLIENT", "::1", 9092, "PLAINTEXT")
    assert str(endpoint) == "CLIENT://[::1]:9092"


def test_advertised_ports_of_zero_become_the_bound_ports():
    settings = listener_settings("CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
                                 "CLIENT://kafka-1.example:0,BROKER://10.0.0.1:9093", MAP, "BROKER")  # fmt: skip
    assert settings.advertised({"CLIENT": 40001, "BROKER": 40002}) == (
        EndPoint("CLIENT", "kafka-1.example", 40001, "PLAINTEXT"),
        EndPoint("BROKER", "10.0.0.1", 9093, "SASL_PLAINTEXT"))  # fmt: skip
    assert settings.inter_broker == "BROKER"


@pytest.mark.parametrize("listeners, advertised, inter_broker, message", [
    ("CLIENT://h:1,CLIENT://h:2", None, None, "names listener CLIENT twice"),
    ("OTHER://h:1", None, None, "listener OTHER has no security protocol"),
    ("SSL://h:1", None, None, r"SSL \(TLS\) is not supported here"),
    ("CLIENT://h", None, None, "expected NAME://host:port"),
    ("CLIENT://h:70000", None, None, "port 70000 is above 65535"),
    ("", None, None, "listeners is empty"),
    ("CLIENT://h:1", "BROKER://h:2", None, "advertised.listeners names BROKER, which is not in listeners"),
    ("CLIENT://0.0.0.0:1", None, None, "advertised as 0.0.0.0"),
    ("CLIENT://h:1", None, "BROKER", "inter.broker.listener.name=BROKER is not an advertised listener"),
    ("CLIENT://h:1", None, "CLIENT", "map it to SASL_PLAINTEXT"),
])  # fmt: skip
def test_bad_listener_settings_say_what_is_wrong(listeners, advertised, inter_broker, message):
    with pytest.raises(ListenerConfigError, match=message):
        listener_settings(listeners, advertised, MAP, inter_broker)


@pytest.mark.parametrize("text, message", [
    ("CLIENT", "expected NAME:PROTOCOL"),
    ("CLIENT:TLS", "unknown security protocol TLS"),
    ("CLIENT:PLAINTEXT,CLIENT:SASL_PLAINTEXT", "names CLIENT twice"),
])  # fmt: skip
def test_bad_protocol_maps(text, message):
    with pytest.raises(ListenerConfigError, match=message):
        parse_protocol_map(text)


def test_the_broker_config_checks_listeners_and_sasl_together(tmp_path):
    with pytest.raises(ConfigError, match="needs credentials: set java.security.auth.login.config"):
        BrokerConfig.from_properties({"listeners": "SASL_PLAINTEXT://127.0.0.1:0"})
    with pytest.raises(ConfigError, match="sasl.enabled.mechanisms: GSSAPI is not supported"):
        BrokerConfig.from_properties({"sasl.enabled.mechanisms": "GSSAPI"})
    with pytest.raises(ConfigError, match="inter.broker.listener.name=PLAINTEXT uses PLAINTEXT"):
        BrokerConfig.from_properties({"inter.broker.listener.name": "PLAINTEXT"})
    config = BrokerConfig.from_properties({
        "listeners": "CLIENT://127.0.0.1:9092,BROKER://127.0.0.1:9093",
        "listener.security.protocol.map": MAP, "inter.broker.listener.name": "BROKER",
        "java.security.auth.login.config": str(tmp_path / "jaas.conf"),
        "super.users": "User:broker; User:admin"})  # fmt: skip
    assert config.super_user_names == {"User:broker", "User:admin"}
    assert config.enabled_mechanisms == ("PLAIN", "SCRAM-SHA-256")


def test_server_properties_files_read_as_java_reads_them(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text(
        "# a comment\n! another\n\nbroker.id=3\nlisteners = CLIENT://127.0.0.1:9092,\\\n"
        "    BROKER://127.0.0.1:9093\nzookeeper.connect: 10.0.0.2:2181/kafka\n"
        "log.dirs=/data/kafka=1\n")  # fmt: skip
    assert read_properties_file(path) == {
        "broker.id": "3", "listeners": "CLIENT://127.0.0.1:9092,BROKER://127.0.0.1:9093",
        "zookeeper.connect": "10.0.0.2:2181/kafka", "log.dirs": "/data/kafka=1"}  # fmt: skip


def test_a_properties_line_without_a_separator_names_its_line(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("broker.id=1\njust words\n")
    with pytest.raises(ConfigError, match=r"server.properties line 2: expected key=value"):
        read_properties_file(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_properties_file(tmp_path / "missing.properties")
