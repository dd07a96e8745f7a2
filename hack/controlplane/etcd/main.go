// Command etcd starts an embedded etcd server for the local test control plane.
//
// It is a deliberately small wrapper around go.etcd.io/etcd/server/v3/embed: a single
// member on loopback, data in --data-dir, client URL from --listen-client-urls. It is
// used only by pkg/testkit and `hack/local-up.sh`; it is not a production etcd.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd data (required)")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL to listen on")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL to listen on")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}

	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("--listen-client-urls: %v", err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("--listen-peer-urls: %v", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = "warmcache-test"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "error"
	// Test data is throwaway: skip fsync so tests are not bound by disk latency.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	defer e.Close()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)

	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd ready on %s", cu.String())
	case err := <-e.Err():
		log.Fatalf("etcd failed: %v", err)
	case <-sig:
		return
	}

	select {
	case err := <-e.Err():
		log.Fatalf("etcd failed: %v", err)
	case <-sig:
		e.Server.Stop()
	}
}
