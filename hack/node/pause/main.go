// Command pause is the pod sandbox ("pause") process of the real test node: it waits for
// SIGINT or SIGTERM and exits 0, and reaps any child handed to it (it is PID 1 of the pod when
// the pod shares its PID namespace). Built static (CGO_ENABLED=0) by hack/build-node.sh and
// packed into the image warmcache.test/pause by pkg/testkit.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
