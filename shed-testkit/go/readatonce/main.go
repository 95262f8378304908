// A Go net/http server that reads every request at once and queues it
// inside: net/http serves each connection on its own goroutine, and the
// handler waits for one of -workers slots before its service time. This is
// the shape of most Go services behind a worker pool, a database pool or a
// lock, and the kernel sees no request waiting unread.
//
// The service time is read from -service-file (microseconds, re-read every
// 50 ms) so a test can slow the service down while it runs.
package main

import (
	"flag"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	workers := flag.Int("workers", 4, "requests served at once")
	serviceFile := flag.String("service-file", "", "file holding the service time in microseconds")
	serviceUs := flag.Int64("service-us", 20000, "service time in microseconds (until -service-file says otherwise)")
	flag.Parse()

	var service atomic.Int64
	service.Store(*serviceUs)
	if *serviceFile != "" {
		go func() {
			for {
				if b, err := os.ReadFile(*serviceFile); err == nil {
					if us, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && us >= 0 {
						service.Store(us)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	slots := make(chan struct{}, *workers)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		slots <- struct{}{}
		time.Sleep(time.Duration(service.Load()) * time.Microsecond)
		<-slots
		w.Header().Set("Content-Length", "3")
		w.Write([]byte("OK\n"))
	})
	server := &http.Server{Addr: *addr, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(server.ListenAndServe())
}
