// Command trackingcheck prints whether a registry built in a normal binary
// tracks messages; the toggle test runs it with WATERMILL_OUTBOX=off.
package main

import (
	"fmt"
	"os"

	"github.com/wmoutbox/outbox"
)

func main() {
	reg, err := outbox.NewRegistry()
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Printf("tracking=%v\n", reg.Enabled())
}
