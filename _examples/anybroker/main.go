// Command anybroker is one service whose pub/sub is chosen at startup, by
// the -broker flag or the OUTBOX_BROKER environment variable: gochannel,
// sql, amqp, kafka, nats or redis. The service (../shop) and the lines
// marked // outbox are the same for all of them; only the constructor of the
// pub/sub differs (brokers.go).
//
//	go run ./_examples/anybroker -broker nats
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/_examples/shop"
)

func main() {
	broker := flag.String("broker", envOr("OUTBOX_BROKER", "gochannel"), "pub/sub: "+strings.Join(brokerNames(), "|"))
	flag.Parse()
	if err := run(*broker); err != nil {
		log.Fatal(err)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(broker string) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NewStdLogger(false, false)

	// The only line that depends on the broker.
	conn, err := connect(ctx, broker, logger)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.close()) }()

	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: shop.Topic, Store: conn.store}) // outbox
	if err != nil {
		return err
	}

	// The service's router, as it was, plus the outbox's lines.
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger) // outbox
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)                                                            // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, conn.pub, outbox.ReplayConfig{}, logger)) // outbox
	router.AddMiddleware(middleware.Recoverer)
	orders, err := outbox.NewPublisher(reg, conn.pub) // outbox
	if err != nil {
		return err
	}
	return shop.Run(ctx, broker, router, conn.sub, orders, reg)
}
