from assay.launch import main

main()
