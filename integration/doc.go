// Package integration runs the end-to-end outbox scenarios (package
// scenarios) against every supported Watermill pub/sub on a real broker:
// GoChannel, watermill-sql on PostgreSQL and MariaDB, watermill-amqp on
// RabbitMQ, watermill-kafka on an in-process Kafka-protocol broker,
// watermill-nats on NATS JetStream and watermill-redisstream on Redis.
//
// It is a module of its own so that the brokers' client libraries stay out
// of the plugin's go.mod. Broker addresses come from the environment, with
// the local defaults:
//
//	OUTBOX_TEST_AMQP_URI   amqp://guest:guest@127.0.0.1:5672/
//	OUTBOX_TEST_NATS_URL   nats://127.0.0.1:4222
//	OUTBOX_TEST_REDIS_ADDR 127.0.0.1:6379
//
// A broker that cannot be reached skips its tests with a message naming it,
// except when CI=true, where it fails them.
package integration
