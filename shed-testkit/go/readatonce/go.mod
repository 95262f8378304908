module shed.test/readatonce

go 1.19
